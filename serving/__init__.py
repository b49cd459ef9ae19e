"""The prediction runtime: model processes, the cache, batching, the protocol's tensors.

Below `api` and beside `worker`: one HTTP-free call per request, its own error classes.
"""
