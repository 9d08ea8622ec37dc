"""Index workloads by operator and dtype: ``tuner best --nearest`` looks tuned shapes up by them.

Revision ID: 0002_workloads_op_dtype
Revises: 0001_initial
"""

from alembic import op

revision = "0002_workloads_op_dtype"
down_revision = "0001_initial"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_workloads_op_dtype", "workloads", ["op", "dtype"])


def downgrade() -> None:
    op.drop_index("ix_workloads_op_dtype", table_name="workloads")
