"""Telemetry: per model-version statistics (`statistics`) and the Prometheus text writer
(`prometheus_text`) that `/metrics` uses. Import what you use from the modules listed below."""

__all__ = ["prometheus_text", "statistics"]
