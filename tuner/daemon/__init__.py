"""The tune-cluster daemon: accepts jobs, leases candidates to agents by device key, records results."""

from tuner.daemon.client import FleetClient
from tuner.daemon.daemon import Daemon, create_server

__all__ = ["Daemon", "FleetClient", "create_server"]
