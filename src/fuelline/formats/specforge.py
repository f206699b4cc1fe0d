"""SpecForge's offline hidden-state files: the methods they are written for, and the keys each holds.

Declared apart from the export (`fuelline.cache.export_specforge`, which writes the files and whose options
the CLI lists without importing torch) and the bridge (`fuelline.cache.specforge`, which reads a
cache as SpecForge's records), which both read them.
"""

# method -> (the key of the captured layers' states, the key of the final state or None)
STATE_KEYS = {"eagle3": ("aux_hidden_state", "hidden_state"),
              "dspark": ("hidden_states", "target_last_hidden_states"),
              "dflash": ("hidden_states", None)}
METHODS = tuple(STATE_KEYS)
