"""One module per console page, each with `render()`: read widgets, call one function of
`storage` (or `planner`), draw. No SQL and no HTTP here; `app/main.py` wires them up."""
