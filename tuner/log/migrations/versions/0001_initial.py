"""The initial schema: workloads, devices, jobs, trials (as tunefleet created it before migrations).

Revision ID: 0001_initial
Revises: (none)
"""

import sqlalchemy as sa
from alembic import op

revision = "0001_initial"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "workloads",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("op", sa.String(), nullable=False),
        sa.Column("params", sa.Text(), nullable=False),
        sa.Column("dtype", sa.String(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_workloads"),
        sa.UniqueConstraint("key", name="uq_workloads_key"),
    )
    op.create_table(
        "devices",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(), nullable=False),
        sa.Column("info", sa.Text(), nullable=False),
        sa.Column("first_seen", sa.DateTime(timezone=False), nullable=False),
        sa.Column("last_seen", sa.DateTime(timezone=False), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_devices"),
        sa.UniqueConstraint("key", name="uq_devices_key"),
    )
    op.create_table(
        "jobs",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("target", sa.String(), nullable=False),
        sa.Column("strategy", sa.String(), nullable=False),
        sa.Column("trials", sa.Integer(), nullable=False),
        sa.Column("options", sa.Text(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=False), nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=False), nullable=True),
        sa.PrimaryKeyConstraint("id", name="pk_jobs"),
        sa.CheckConstraint("status IN ('running', 'done', 'failed', 'cancelled')", name="ck_jobs_status"),
        sa.ForeignKeyConstraint(["workload_id"], ["workloads.id"], name="fk_jobs_workload_id_workloads"),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"], name="fk_jobs_device_id_devices"),
    )
    op.create_index("ix_jobs_workload_id", "jobs", ["workload_id"])
    op.create_index("ix_jobs_device_id", "jobs", ["device_id"])
    op.create_table(
        "trials",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Integer(), nullable=True),
        sa.Column("workload_id", sa.Integer(), nullable=False),
        sa.Column("device_id", sa.Integer(), nullable=False),
        sa.Column("target", sa.String(), nullable=False),
        sa.Column("config_json", sa.Text(), nullable=False),
        sa.Column("config_digest", sa.String(16), nullable=False),
        sa.Column("status", sa.String(32), nullable=False),
        sa.Column("costs", sa.Text(), nullable=False),
        sa.Column("mean_s", sa.Double(), nullable=True),
        sa.Column("compile_time_s", sa.Double(), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.Column("agent", sa.String(), nullable=False),
        sa.Column("template_version", sa.String(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=False), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_trials"),
        sa.UniqueConstraint(
            "workload_id", "device_id", "target", "config_digest",
            name="uq_trials_workload_id_device_id_target_config_digest",
        ),
        sa.CheckConstraint("mean_s IS NULL OR status = 'ok'", name="ck_trials_mean_only_ok"),
        sa.ForeignKeyConstraint(["job_id"], ["jobs.id"], name="fk_trials_job_id_jobs", ondelete="SET NULL"),
        sa.ForeignKeyConstraint(["workload_id"], ["workloads.id"], name="fk_trials_workload_id_workloads"),
        sa.ForeignKeyConstraint(["device_id"], ["devices.id"], name="fk_trials_device_id_devices"),
    )
    op.create_index("ix_trials_best", "trials", ["workload_id", "device_id", "target", "mean_s"])
    op.create_index("ix_trials_job_id", "trials", ["job_id"])
    op.create_index("ix_trials_created_at", "trials", ["created_at"])


def downgrade() -> None:
    op.drop_table("trials")
    op.drop_table("jobs")
    op.drop_table("devices")
    op.drop_table("workloads")
