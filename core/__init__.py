"""Shared by api, worker and the command line: settings (database and specs to come)."""
