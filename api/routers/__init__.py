"""The API's routers, one per resource; each sets its prefix and tags once."""
