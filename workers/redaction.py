"""Secrets out of every log record, at every level, ours and the libraries'.

The libraries log what we hand them: kafka-python's admin client logs its whole
configuration at debug level (``Starting KafkaAdminClient with configuration: {...,
'sasl_plain_password': ...}``), and a Redis URL carries its password wherever it is
printed.  So a process that reads a secret setting registers the secret here
(:class:`workers.settings.Settings` does it for each of its secret fields), and from then
on every log record is made with each registered secret replaced by ``***`` -- in its
message, its arguments, its traceback and its stack.

The place every record passes through, whichever logger made it and whichever handler
and formatter (Faust's and mode's included) will print it, is the log record factory
(``logging.setLogRecordFactory``, the standard library's documented hook): a filter on a
logger would miss its children's records, and a filter on a handler would miss the
handlers a library installs later.

>>> import logging, io
>>> register("hunter2")
>>> stream = io.StringIO()
>>> handler = logging.StreamHandler(stream)
>>> logger = logging.getLogger("doctest.redaction")
>>> logger.addHandler(handler)
>>> logger.warning("config: %s", {"sasl_plain_password": "hunter2"})
>>> stream.getvalue()
"config: {'sasl_plain_password': '***'}\\n"
>>> logger.removeHandler(handler)
>>> redact("redis://:hunter2@host:6379/0")
'redis://:***@host:6379/0'
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from functools import partial
from typing import Any
from urllib.parse import quote, quote_plus

MASK = "***"

_secrets: list[str] = []  # longest first, so a secret inside another is not half-masked
_lock = threading.Lock()
_installed = False
_formatter = logging.Formatter()


def register(*secrets: str | None) -> None:
    """Mask these values -- and their URL-encoded spellings, as they appear in a URL -- in
    every log record made from now on (empty values are ignored)."""
    global _installed, _secrets
    spellings = {
        form for secret in secrets if secret for form in (secret, quote(secret, safe=""), quote_plus(secret))
    }
    with _lock:
        _secrets = sorted(set(_secrets) | spellings, key=len, reverse=True)
        if not _installed:
            logging.setLogRecordFactory(partial(_make_record, logging.getLogRecordFactory()))
            _installed = True


def redact(text: str) -> str:
    """``text`` with every registered secret replaced by ``***``."""
    for secret in _secrets:
        if secret in text:
            text = text.replace(secret, MASK)
    return text


def _make_record(previous: Callable[..., logging.LogRecord], *args: Any, **kwargs: Any) -> logging.LogRecord:
    record = previous(*args, **kwargs)
    if _secrets:
        _scrub(record)
    return record


def _scrub(record: logging.LogRecord) -> None:
    """The record's message formatted now and masked (its arguments dropped: they are in
    it); its traceback formatted now and masked (formatters print ``exc_text`` when set)."""
    try:
        message = record.getMessage()
    except Exception:  # a broken format string: logging would print the raw arguments
        message = f"{record.msg!s} % {record.args!r}"
    clean = redact(message)
    if clean != message or record.args:
        record.msg, record.args = clean, None
    if record.exc_info and record.exc_info[0] is not None and not record.exc_text:
        record.exc_text = redact(_formatter.formatException(record.exc_info))
    if record.stack_info:
        record.stack_info = redact(record.stack_info)
