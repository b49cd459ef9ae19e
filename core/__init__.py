"""Shared by api, worker and the command line: settings, database, job kinds, domain services."""
