"""Studies: the papers' experiments as one request.

A study is a base train spec, a grid of axes and seeds (`grid`); it expands into one
ordinary train job per cell and seed, which knows its study and cell. `service` creates,
releases (at most `max_parallel` jobs of a study on the queue at once), cancels and
deletes studies; `results` aggregates each cell over seeds beside the papers' numbers;
`presets` encodes the papers' figures and tables.
"""
