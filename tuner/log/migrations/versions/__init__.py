"""Revisions of the tuning log's schema (one file each; see the parent package)."""
