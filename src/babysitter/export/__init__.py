"""Exporters of tracker state: Prometheus (scrape) and OTLP (push)."""
