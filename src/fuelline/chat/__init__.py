"""Chat and distillation data: chat records, chat templates with exact loss masks, SFT data."""
