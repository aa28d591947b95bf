"""Chart builders: plain functions returning Plotly figures, tested without Streamlit.

timeseries (the monitoring pages), planner, cost, probes (the one renderer of a probe
kind's declared chart, and CDFs of request records).
"""
