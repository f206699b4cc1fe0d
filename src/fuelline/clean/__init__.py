"""Cleaning: text normalization, poetry rules, web quality filters, boilerplate removal."""
