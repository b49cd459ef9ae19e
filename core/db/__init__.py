"""The database: engine and sessions (`session`), ORM tables (`tables`)."""
