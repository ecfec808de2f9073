"""Streaming multipart upload: parse as the bytes arrive, spool the file, enforce the limit.

The request body is fed chunk by chunk into python-multipart's push parser. Form fields
(small) are kept in order; the file part goes into a spooled temporary file (memory up to
1 MiB, then disk), so no upload is ever held whole in memory, and none is re-encoded: the
gateway forwards the same bytes. The size limit is checked on every chunk, so an oversize
upload is refused as soon as it crosses the limit. The gateway and the CPU worker both
read their forms here (python-multipart comes with their extras).

A reader told of each field as it is parsed (`on_field`), before any part after it is read,
can refuse the request there (the gateway routes by `model`: an unknown one is answered
without reading the file that follows it) or lower the limit for the rest of the upload.
"""

from __future__ import annotations

import tempfile
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import IO

from python_multipart.multipart import MultipartParser, MultipartState, parse_options_header
from starlette.requests import ClientDisconnect

from .diarization import MAX_KNOWN_SPEAKERS, REFERENCE_FIELD_BYTES
from .errors import APIError, bad_request, too_large

# Room for the multipart framing and form fields around the file, when comparing a
# request's Content-Length with the file size limit before reading it.
FORM_OVERHEAD = 256 * 1024
SPOOL_BYTES = 1024 * 1024
MAX_FIELD_BYTES = 64 * 1024  # a prompt is a few hundred tokens; no other field needs more
# A known speaker's reference clip comes as a data URL (2-10 s of audio), up to four of them:
# all the form's fields together stay within FIELDS_BYTES.
LARGE_FIELDS = {
    "known_speaker_references[]": REFERENCE_FIELD_BYTES,
    "known_speaker_references": REFERENCE_FIELD_BYTES,
}
FIELDS_BYTES = MAX_KNOWN_SPEAKERS * REFERENCE_FIELD_BYTES + MAX_FIELD_BYTES
MAX_FIELDS = 64
MAX_BOUNDARY_BYTES = 200  # RFC 2046: at most 70; python-multipart's own cap is 256
# The file's first bytes `parse_upload` hands `on_file_head` while the rest still streams:
# enough for the length fields of every audio container the gateway reads (WAV, FLAC, AIFF,
# AU, Ogg's rate, an MP3 frame) but an MP3's behind a large ID3 tag, for autoscaling.
FILE_HEAD = 4 * 1024


@dataclass
class Upload:
    """The parsed form: every field in the order sent, and the spooled file."""

    fields: list[tuple[str, str]] = field(default_factory=list)
    file: IO[bytes] | None = None
    filename: str = "audio"
    file_content_type: str = "application/octet-stream"
    size: int = 0
    in_memory = False  # an upload the gateway holds is spooled to disk

    def get(self, name: str) -> str | None:
        for k, v in self.fields:
            if k == name:
                return v
        return None

    def get_all(self, name: str) -> list[str]:
        return [v for k, v in self.fields if k == name]

    def to_disk(self) -> None:
        """Move the file out of memory (a small upload's spool is in memory until 1 MiB):
        for uploads that wait, such as those the gateway holds while a pool scales up."""
        if isinstance(self.file, tempfile.SpooledTemporaryFile):
            self.file.rollover()

    def close(self) -> None:
        if self.file is not None:
            self.file.close()


@dataclass(frozen=True)
class Limit:
    """An upload limit, and the error that refuses a file past it."""

    bytes: int
    error: APIError


# Told of each form field (name, value) as it is parsed: may raise APIError to refuse the
# request there, or return a lower limit for the file (already read, or still to come).
OnField = Callable[[str, str], Limit | None]


class _Part:
    def __init__(self) -> None:
        self.headers: dict[str, str] = {}
        self.name = ""
        self.filename: str | None = None
        self.content_type = "application/octet-stream"
        self.data = bytearray()
        self.size = 0


def _clean_type(sent: str | None, default: str) -> str:
    """A part's Content-Type as the worker may get it: printable ASCII, or the default
    (the gateway forwards it in a header of its own request: no CR, LF or NUL)."""
    if sent and len(sent) <= 255 and all(" " <= c <= "~" for c in sent):
        return sent.strip() or default
    return default


def boundary_of(content_type: str | None) -> bytes:
    ctype, params = parse_options_header(content_type or "")
    if ctype != b"multipart/form-data":
        # OpenAI's answer to a wrong content type: 400, not 415.
        raise bad_request(
            "the request must be multipart/form-data with a `file` part "
            f"(got {ctype.decode('latin-1') or 'no content type'})",
            code="unsupported_content_type",
        )
    boundary = params.get(b"boundary")
    if not boundary:
        raise bad_request("multipart/form-data without a boundary", param="file")
    return boundary


def check_length(content_length: str | None, limit: int) -> None:
    """Refuse a body whose declared length cannot fit the limit, before reading it."""
    if content_length and content_length.isdigit() and int(content_length) > limit + FORM_OVERHEAD:
        raise too_large(limit)


async def parse_upload(
    stream: AsyncIterator[bytes], content_type: str | None, limit: int,
    on_field: OnField | None = None, on_file_head: Callable[[bytes], None] | None = None,
) -> Upload:  # fmt: skip
    """Parse a multipart body from `stream`; raise APIError (400/413) on bad input, or the
    one `on_field` raises. `on_file_head(head)` is called once with the file's first
    FILE_HEAD bytes as soon as they have arrived (the whole file, when it is shorter)."""
    upload = Upload()
    cap = Limit(limit, too_large(limit))
    part: _Part | None = None
    header_field = bytearray()
    header_value = bytearray()
    errors: list[APIError] = []
    held = [0]  # bytes of the fields (not the file) held in memory
    head = bytearray()

    def file_head(data: bytes, end: bool = False) -> None:
        nonlocal on_file_head
        if on_file_head is None:
            return
        head.extend(data[: FILE_HEAD - len(head)])
        if end or len(head) >= FILE_HEAD:
            call = on_file_head
            on_file_head = None
            call(bytes(head))

    def on_part_begin() -> None:
        nonlocal part
        part = _Part()

    def on_header_field(data: bytes, start: int, end: int) -> None:
        header_field.extend(data[start:end])

    def on_header_value(data: bytes, start: int, end: int) -> None:
        header_value.extend(data[start:end])

    def on_header_end() -> None:
        assert part is not None
        part.headers[header_field.decode("latin-1").lower()] = header_value.decode("latin-1")
        header_field.clear()
        header_value.clear()

    def on_headers_finished() -> None:
        assert part is not None
        _, opts = parse_options_header(part.headers.get("content-disposition", ""))
        part.name = opts.get(b"name", b"").decode("utf-8", "replace")
        if b"filename" in opts:
            part.filename = opts[b"filename"].decode("utf-8", "replace") or "audio"
            part.content_type = _clean_type(part.headers.get("content-type"), part.content_type)
        if part.name == "file":
            if upload.file is not None:
                errors.append(bad_request("more than one `file` part", param="file"))
                return
            upload.file = tempfile.SpooledTemporaryFile(max_size=SPOOL_BYTES)  # noqa: SIM115
            upload.filename = part.filename or "audio"
            upload.file_content_type = part.content_type

    def on_part_data(data: bytes, start: int, end: int) -> None:
        assert part is not None
        n = end - start
        part.size += n
        if part.name == "file" and upload.file is not None and not errors:
            upload.size += n
            if upload.size > cap.bytes:
                errors.append(cap.error)
                return
            chunk = data[start:end]
            upload.file.write(chunk)
            file_head(chunk)
        elif part.name != "file":
            limit = LARGE_FIELDS.get(part.name, MAX_FIELD_BYTES)
            held[0] += n
            if part.size > limit or held[0] > FIELDS_BYTES:
                if not errors:
                    what = f"form field `{part.name}` is over {limit} bytes"
                    if part.size <= limit:
                        what = f"the form's fields are over {FIELDS_BYTES} bytes together"
                    errors.append(bad_request(what, param=part.name))
                return
            part.data.extend(data[start:end])

    def on_part_end() -> None:
        assert part is not None
        if part.name == "file" and not errors:
            file_head(b"", end=True)
        if part.name != "file":
            if len(upload.fields) >= MAX_FIELDS:
                errors.append(bad_request(f"more than {MAX_FIELDS} form fields"))
                return
            try:
                upload.fields.append((part.name, part.data.decode("utf-8")))
            except UnicodeDecodeError:
                errors.append(
                    bad_request(f"form field `{part.name}` is not UTF-8", param=part.name)
                )
                return
            if on_field is not None and not errors:
                field_read(*upload.fields[-1])

    def field_read(name: str, value: str) -> None:
        nonlocal cap
        assert on_field is not None
        try:
            lower = on_field(name, value)
        except APIError as e:
            errors.append(e)
            return
        if lower is not None and lower.bytes < cap.bytes:
            cap = lower
            if upload.size > cap.bytes:
                errors.append(cap.error)

    boundary = boundary_of(content_type)
    if len(boundary) > MAX_BOUNDARY_BYTES:
        raise bad_request(
            f"the multipart boundary is over {MAX_BOUNDARY_BYTES} characters", param="file"
        )
    parser = MultipartParser(
        boundary,
        callbacks={
            "on_part_begin": on_part_begin,
            "on_part_data": on_part_data,
            "on_part_end": on_part_end,
            "on_header_field": on_header_field,
            "on_header_value": on_header_value,
            "on_header_end": on_header_end,
            "on_headers_finished": on_headers_finished,
        },
    )
    try:
        async for chunk in stream:
            if chunk:
                parser.write(chunk)
            if errors:
                raise errors[0]
        parser.finalize()
        if parser.state != MultipartState.END:
            # python-multipart's finalize() does not check this: a body cut short (a dropped
            # connection, a proxy's limit) would pass for the whole upload.
            raise bad_request(
                "the multipart body is incomplete: it ended without its closing boundary "
                "(the upload was cut short?)",
                param="file",
                code="incomplete_upload",
            )
    except APIError:
        upload.close()
        raise
    except ClientDisconnect as e:
        upload.close()
        raise bad_request(
            "the request body ended before its Content-Length (the upload was cut short)",
            param="file",
            code="incomplete_upload",
        ) from e
    except Exception as e:  # python-multipart raises its own errors on malformed bodies
        upload.close()
        raise bad_request(f"malformed multipart body: {e}", param="file") from e
    if errors:
        upload.close()
        raise errors[0]
    if upload.file is None:
        raise bad_request(
            "the `file` part is missing: send the audio as a file named `file`", param="file"
        )
    upload.file.seek(0)
    return upload
