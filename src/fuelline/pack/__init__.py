"""Packing: templates that render documents to ids and loss mask, and the parallel packer."""
