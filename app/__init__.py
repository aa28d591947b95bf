"""The console and the command line: everything a person touches.

main.py (`st.navigation`; every page renders through `common.error_boundary`)
views/ (one module per page: read widgets, call one function, render)   charts/ (Plotly
figure builders, tested without Streamlit)   common.py (the pages' error boundary, cached
reads, shared widgets)   exports/ (Prometheus alerting rules, Grafana dashboard)
cli/ (Typer: `kvscope ...`; its `main()` is the command line's error boundary).

It imports `planner` and `storage`. From `probes` it takes only request and result types
and the definitions they carry (probe kinds and parameters, alert rules, engine specs,
metric spellings), and in cli/ the entry points a command starts: the worker, a tiny model
build, a one-off scrape or probe run. Only `app/` imports Streamlit (main.py, common.py
and views/); nothing outside it may.
"""
