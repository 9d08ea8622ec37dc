"""Leadership of the tune-cluster: the lease a leading daemon holds and the epoch that fences it.

Revision ID: 0004_daemon_leadership
Revises: 0003_workload_families
"""

import sqlalchemy as sa
from alembic import op

revision = "0004_daemon_leadership"
down_revision = "0003_workload_families"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "daemon_leadership",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("epoch", sa.BigInteger(), nullable=False),
        sa.Column("holder", sa.String(), nullable=False),
        sa.Column("address", sa.String(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.CheckConstraint("id = 1", name="ck_daemon_leadership_single_row"),
        sa.PrimaryKeyConstraint("id", name="pk_daemon_leadership"),
    )


def downgrade() -> None:
    op.drop_table("daemon_leadership")
