"""Export a token dataset to Megatron-LM's indexed dataset: `PREFIX.bin` and `PREFIX.idx`.

Megatron's `IndexedDataset` reads two files that share a prefix. Each document of ours becomes
one Megatron sequence and one Megatron document (Megatron lets a document hold several sequences,
e.g. one per sentence; we never split). All integers are little-endian.

    PREFIX.bin   the token ids back to back, no header: byte for byte our tokens.bin
    PREFIX.idx   for N documents, 42 + 20 N bytes:

        offset       size      field
        0            9         magic b"MMIDIDX\\x00\\x00"
        9            8         version, uint64, always 1
        17           1         dtype code of .bin, uint8: 8 = uint16, 4 = int32
        18           8         sequence count N, uint64
        26           8         document index count N + 1, uint64
        34           4 N       sequence lengths in tokens, int32
        34 + 4 N     8 N       sequence starts in .bin, in bytes, int64
        34 + 12 N    8 (N+1)   document indices: the first sequence of each document, then N;
                               one sequence per document makes them 0, 1, ..., N

Megatron's dtype codes have no unsigned 32-bit type, so a uint32 dataset is exported as int32
(code 4), as Megatron's own preprocessing does for vocabularies above 65,500: the bytes are the
same for every id below 2**31, and the manifest's vocab_size is checked to be at most 2**31.
A uint16 dataset stays uint16 (code 8).

Megatron's format has no place for a loss mask: mask.bin is dropped and every token is a
training target. The manifest's tokenizer, bos/eos ids and checksums stay with our dataset.

Cost: the .bin is a streamed copy (16 MiB blocks) and the .idx is computed from our uint64
offsets a million documents at a time, so memory stays flat whatever the corpus size. Both files
are written atomically; an old PREFIX.idx is removed first and the new one lands last, so a
PREFIX.idx on disk always belongs to the PREFIX.bin beside it.

Limits, checked before anything is written: a document must be shorter than 2**31 tokens (the
lengths are int32), and the dataset must hold at least one token (Megatron memory-maps PREFIX.bin
and an empty file cannot be mapped). Empty documents are kept, as sequences of length 0.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path
from typing import IO, Iterator

import numpy as np

from fuelline.formats.tokens import OFFSETS, TOKENS, TokenFiles, TokenFormatError, verify_token_dataset
from fuelline.io.atomic import atomic_write

MAGIC, VERSION = b"MMIDIDX\x00\x00", 1
HEADER = struct.Struct("<9sQBQQ")  # magic, version, dtype code, sequence count, document index count
DTYPE_CODES = {"uint16": 8, "uint32": 4}  # our dtype -> Megatron's code (uint16, int32)
MAX_LENGTH = int(np.iinfo(np.int32).max)
COPY_BLOCK = 16 << 20  # bytes
DOC_BLOCK = 1 << 20  # documents


def megatron_paths(output_prefix: str | os.PathLike) -> tuple[Path, Path]:
    """The .bin and .idx paths Megatron derives from a prefix (it appends the suffixes)."""
    prefix = os.fspath(output_prefix)
    if prefix.endswith((".bin", ".idx")):
        raise ValueError(f"{prefix}: give the output prefix without .bin or .idx (both files are written, "
                         f"as {prefix[:-4]}.bin and {prefix[:-4]}.idx)")
    return Path(prefix + ".bin"), Path(prefix + ".idx")


def export_megatron(token_dir: str | os.PathLike, output_prefix: str | os.PathLike, *,
                    verify: bool = True) -> tuple[Path, Path]:
    """Write the token dataset at `token_dir` as `output_prefix`.bin and .idx; return both paths.
    `verify`: check it whole first (`verify_token_dataset`: every sha256, the ids), so damaged
    tokens are refused rather than copied into a file Megatron trusts; one more read of tokens.bin."""
    if verify:
        verify_token_dataset(token_dir)
    files = TokenFiles(token_dir)
    bin_path, idx_path = megatron_paths(output_prefix)
    _check_exportable(files, bin_path, idx_path)
    idx_path.unlink(missing_ok=True)  # a stale index must never sit beside the new .bin
    _copy_tokens(files.directory / TOKENS, bin_path)
    with atomic_write(idx_path) as f:
        _write_index(f, files)
    return bin_path, idx_path


def _check_exportable(files: TokenFiles, bin_path: Path, idx_path: Path) -> None:
    m = files.manifest
    if m["num_tokens"] == 0:
        raise TokenFormatError(files.directory, "holds no tokens; Megatron cannot read an empty .bin "
                                                "(it memory-maps the file), so nothing is exported")
    if m["dtype"] == "uint32" and m["vocab_size"] > 2**31:
        raise TokenFormatError(files.directory, f"vocab_size {m['vocab_size']:,} is above 2**31: Megatron reads "
                                                "32-bit token ids as int32, so ids this large cannot be exported")
    own = {files.directory.resolve() / TOKENS, files.directory.resolve() / OFFSETS}
    for path in (bin_path, idx_path):
        if path.resolve() in own:
            raise ValueError(f"{path}: this is a file of the token dataset itself; choose another output prefix")
    for first, lengths in _length_blocks(files.offsets):  # opening checked they run from 0 up to num_tokens
        if lengths.max() > MAX_LENGTH:
            k = first + int(np.argmax(lengths))
            raise ValueError(f"{files.directory}: document {k:,} has {int(lengths[k - first]):,} tokens; Megatron "
                             f"stores lengths as int32, so a document may hold at most {MAX_LENGTH:,}")


def _length_blocks(offsets: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """(first document, int64 lengths) for consecutive blocks of up to DOC_BLOCK documents."""
    num_documents = len(offsets) - 1
    for first in range(0, num_documents, DOC_BLOCK):
        stop = min(first + DOC_BLOCK, num_documents)
        yield first, np.diff(offsets[first:stop + 1].astype(np.int64))


def _copy_tokens(source: Path, bin_path: Path) -> None:
    with open(source, "rb") as src, atomic_write(bin_path) as out:
        shutil.copyfileobj(src, out, COPY_BLOCK)


def _write_index(f: IO[bytes], files: TokenFiles) -> None:
    """The .idx body after Megatron's layout (module docstring): header, lengths, pointers, document indices."""
    offsets, itemsize = files.offsets, files.dtype.itemsize
    n = files.num_documents
    f.write(HEADER.pack(MAGIC, VERSION, DTYPE_CODES[files.manifest["dtype"]], n, n + 1))
    for _, lengths in _length_blocks(offsets):
        f.write(lengths.astype("<i4").tobytes())
    for first in range(0, n, DOC_BLOCK):
        starts = offsets[first:min(first + DOC_BLOCK, n)].astype("<i8") * itemsize
        f.write(starts.tobytes())
    for first in range(0, n + 1, DOC_BLOCK):
        f.write(np.arange(first, min(first + DOC_BLOCK, n + 1), dtype="<i8").tobytes())
