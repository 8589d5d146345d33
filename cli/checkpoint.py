"""Training checkpoints as data, and the run folder's atomic writes.

A checkpoint is a safetensors file: tensors and a JSON header, never code (no pickle: unpickling runs whatever the
file says). The header's metadata holds the run's state as JSON and a SHA-256 of every byte of the file, computed
with the digest's own 64 characters as zeros, so a flipped bit or a cut-short file is found before anything is
used. The last two are kept (`checkpoint-NNNNNN.safetensors`, numbered in writing order); a corrupt newest one
falls back to the one before, with a warning.

Every file of the run folder is written to `.NAME.dlnet-tmp-PID` beside it, fsynced, and renamed into place; the
temporary file is removed on every error (a signal included); one that a killed process left is removed by the
next run into the folder.
"""
import contextlib
import hashlib
import hmac
import json
import os
import re
import struct

from dlnet.errors import ConfigError

NAME = re.compile(r"^checkpoint-(\d{6,})\.safetensors$")
TEMP = re.compile(r"^\..+\.dlnet-tmp-(\d+)$")
LEGACY = "checkpoint.pkl"
FORMAT = "dlnet-checkpoint-1"
DIGEST_KEY = b'"sha256":"'
PLACEHOLDER = "0" * 64
MAX_HEADER = 100 << 20  # safetensors' own limit on the JSON header


class CorruptCheckpoint(ConfigError):
    """A checkpoint file that is not what dlnet wrote: cut short, bytes changed, or not a checkpoint at all."""


# atomic writes ------------------------------------------------------------------------------------------------------
def temp_path(path):
    folder, name = os.path.split(os.path.abspath(path))
    return os.path.join(folder, f".{name}.dlnet-tmp-{os.getpid()}")


def write_chunks(f, chunks):
    """The one place a run folder's bytes are written (a test replaces it to stop a write half-way)."""
    for chunk in chunks:
        f.write(chunk)


def write_atomic(path, *chunks):
    """Write the byte strings `chunks` to `path` through a temporary file beside it, fsynced, then renamed. An
    OSError (disk full, read-only folder) is a ConfigError naming `path`; on any error or signal the temporary file
    is removed and the old `path`, if any, is left as it was."""
    tmp = temp_path(path)
    try:
        try:
            with open(tmp, "wb") as f:
                write_chunks(f, chunks)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except OSError as e:
            raise ConfigError(f"{path}: could not write it ({e.strerror or e})") from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_folder(os.path.dirname(os.path.abspath(path)))


def _fsync_folder(folder):
    """Make a rename durable (where the file system allows opening a folder)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _alive(pid):
    if pid == os.getpid():
        return False  # a file of this pid that exists before this run wrote anything: an earlier process's
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, OverflowError):
        return False
    except PermissionError:
        return True
    return True


def remove_stale_temps(folder):
    """Remove the temporary files (`.NAME.dlnet-tmp-PID`) in `folder` whose process is gone; returns their names."""
    removed = []
    for name in sorted(os.listdir(folder)) if os.path.isdir(folder) else []:
        m = TEMP.match(name)
        if m and not _alive(int(m.group(1))):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(os.path.join(folder, name))
            removed.append(name)
    return removed


# checkpoints --------------------------------------------------------------------------------------------------------
def checkpoints(folder):
    """[(number, path)] of the folder's checkpoints, newest first."""
    found = []
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        m = NAME.match(name)
        if m:
            found.append((int(m.group(1)), os.path.join(folder, name)))
    return sorted(found, reverse=True)


def save_checkpoint(folder, tensors, state, keep=None):
    """Write {name: array} and the JSON-able `state` as the folder's next checkpoint; then remove the older ones
    except `keep` (the previous good checkpoint). Returns the new file's path."""
    import safetensors.numpy
    number = max((n for n, _ in checkpoints(folder)), default=0) + 1
    path = os.path.join(folder, f"checkpoint-{number:06d}.safetensors")
    metadata = {"format": FORMAT, "state": json.dumps(state), "sha256": PLACEHOLDER}
    blob = memoryview(safetensors.numpy.save(tensors, metadata=metadata))
    at = _digest_offset(blob, PLACEHOLDER)
    digest = hashlib.sha256(blob).hexdigest().encode()
    write_atomic(path, blob[:at], digest, blob[at + 64:])
    for _, old in checkpoints(folder):
        if old not in (path, keep):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(old)
    return path


def _digest_offset(blob, digest):
    """Where the 64 digest characters start in the header (the header's JSON has one "sha256" key)."""
    (size,) = struct.unpack("<Q", blob[:8])
    header = bytes(blob[8:8 + size])
    at = header.find(DIGEST_KEY + digest.encode() + b'"')
    if at < 0 or header.count(DIGEST_KEY) != 1:
        raise CorruptCheckpoint("no checksum in the header")
    return 8 + at + len(DIGEST_KEY)


def read_checkpoint(path):
    """({name: array}, state) of a checkpoint whose checksum matches; CorruptCheckpoint (naming the file) when it
    does not, or when the file is not a dlnet checkpoint at all."""
    import safetensors.numpy
    try:
        with open(path, "rb") as f:
            blob = f.read()
    except OSError as e:
        raise CorruptCheckpoint(f"{path}: could not read it ({e.strerror})") from None
    try:
        metadata = _header(blob)["__metadata__"]
        digest = metadata["sha256"]
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise ValueError("no checksum in the header")
        at = _digest_offset(memoryview(blob), digest)
        h = hashlib.sha256(blob[:at])
        h.update(PLACEHOLDER.encode())
        h.update(blob[at + 64:])
        if not hmac.compare_digest(h.hexdigest(), digest):
            raise ValueError("checksum mismatch: the file changed after it was written")
        if metadata.get("format") != FORMAT:
            raise ValueError(f"format {metadata.get('format')!r}, expected {FORMAT}")
        state = json.loads(metadata["state"])
        tensors = safetensors.numpy.load(blob)
    except CorruptCheckpoint as e:
        raise CorruptCheckpoint(f"{path}: not a good checkpoint ({e})") from None
    except Exception as e:  # whatever a hostile file makes the parsers raise (they run no code of its own)
        raise CorruptCheckpoint(f"{path}: not a good checkpoint ({' '.join(str(e).split()) or type(e).__name__})") \
            from None
    return tensors, state


def _header(blob):
    """The safetensors JSON header of `blob`, checked for size before it is parsed."""
    if len(blob) < 8:
        raise ValueError(f"{len(blob)} bytes, too short for a safetensors file")
    (size,) = struct.unpack("<Q", blob[:8])
    if size > min(MAX_HEADER, len(blob) - 8):
        raise ValueError(f"header of {size} bytes in a file of {len(blob)}: cut short, or not a safetensors file")
    header = json.loads(blob[8:8 + size])
    if not isinstance(header, dict) or not isinstance(header.get("__metadata__"), dict):
        raise ValueError("no metadata in the header")
    return header


def load_newest(folder, warn):
    """(path, tensors, state) of the newest good checkpoint in `folder`, or None where it has none. A corrupt one is
    reported through warn(line) and the one before it tried; when none is good, the newest one's problem is a
    ConfigError. An old pickle checkpoint is refused unread."""
    found = checkpoints(folder)
    legacy = os.path.join(folder, LEGACY)
    if not found and os.path.exists(legacy):
        raise ConfigError(f"{legacy}: a pickle checkpoint of an older dlnet, not read (unpickling can run any code); "
                          f"start this run again with --force")
    first = None
    for k, (_, path) in enumerate(found):
        try:
            tensors, state = read_checkpoint(path)
        except CorruptCheckpoint as e:
            first = first or e
            if k + 1 < len(found):
                warn(f"{e}; using {os.path.basename(found[k + 1][1])} instead")
            continue
        return path, tensors, state
    if first is not None:
        raise ConfigError(f"{first}; no good checkpoint in {folder} (start again with --force)")
    return None
