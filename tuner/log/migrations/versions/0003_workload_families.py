"""Shape-range families: a range such as matmul(M=1..512,...) and the representative shapes tuned for it.

Revision ID: 0003_workload_families
Revises: 0002_workloads_op_dtype
"""

import sqlalchemy as sa
from alembic import op

revision = "0003_workload_families"
down_revision = "0002_workloads_op_dtype"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "workload_families",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("op", sa.String(), nullable=False),
        sa.Column("dtype", sa.String(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=False), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_workload_families"),
        sa.UniqueConstraint("key", name="uq_workload_families_key"),
    )
    op.create_index("ix_workload_families_op", "workload_families", ["op"])
    op.create_table(
        "workload_family_members",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("family_id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_workload_family_members"),
        sa.UniqueConstraint("family_id", "workload_id", name="uq_workload_family_members_family_id_workload_id"),
        sa.ForeignKeyConstraint(["family_id"], ["workload_families.id"], ondelete="CASCADE",
                                name="fk_workload_family_members_family_id_workload_families"),
        sa.ForeignKeyConstraint(["workload_id"], ["workloads.id"],
                                name="fk_workload_family_members_workload_id_workloads"),
    )


def downgrade() -> None:
    op.drop_table("workload_family_members")
    op.drop_index("ix_workload_families_op", table_name="workload_families")
    op.drop_table("workload_families")
