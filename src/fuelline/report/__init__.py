"""The funnel report: what every stage kept and dropped, as text, JSON and HTML with charts."""
