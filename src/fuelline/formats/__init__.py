"""On-disk formats, one module each: the bytes, one writer, one reader, their checks."""
