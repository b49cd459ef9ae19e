"""Settings, database and job specs shared by api and worker: filled by the service issue."""
