"""Logging-extension updates (pystub_backend.backend.log.update_settings) and the filter they drive."""

from __future__ import annotations

import io
import logging
import re
from collections.abc import Iterator
from dataclasses import asdict

import pytest

from pystub_backend.backend import log as backend_log
from pystub_backend.backend.errors import ServerError, Status
from pystub_backend.backend.log import LogSettings, configure_logging, update_settings


@pytest.fixture(autouse=True)
def _restore_settings() -> Iterator[None]:
    saved = asdict(backend_log.settings)
    logger = logging.getLogger("pystub")
    handlers, propagate, level = list(logger.handlers), logger.propagate, logger.level
    yield
    for key, value in saved.items():
        setattr(backend_log.settings, key, value)
    logger.handlers[:] = handlers
    logger.propagate, logger.level = propagate, level


def test_update_applies_only_the_given_keys():
    result = update_settings({"log_verbose_level": 2, "log_warning": False})
    assert result == {**LogSettings().as_dict(), "log_verbose_level": 2, "log_warning": False}
    assert update_settings({}) == result
    assert update_settings({"no_such_key": 1, "log_format": "ISO8601"})["log_format"] == "ISO8601"


@pytest.mark.parametrize("updates", [
    {"log_info": 1}, {"log_warning": "true"}, {"log_error": None}, {"log_verbose_level": -1},
    {"log_verbose_level": 1.5}, {"log_verbose_level": False}, {"log_format": "iso8601"},
    {"log_info": False, "log_format": "json"},
])
def test_invalid_values_are_refused_all_or_nothing(updates):
    with pytest.raises(ServerError) as info:
        update_settings(updates)
    assert info.value.status == Status.INVALID_ARG
    assert backend_log.settings == LogSettings()


def test_log_file_is_unsupported():
    with pytest.raises(ServerError) as info:
        update_settings({"log_file": "", "log_info": False})
    assert info.value.status == Status.UNSUPPORTED
    assert info.value.message == "log file location can not be updated through network protocol"
    assert backend_log.settings.log_info


def test_changes_take_effect_on_the_next_record():
    configure_logging(LogSettings())
    stream = io.StringIO()
    handler = logging.getLogger("pystub").handlers[0]
    assert isinstance(handler, logging.StreamHandler)
    handler.setStream(stream)
    log = logging.getLogger("pystub.stub")
    log.debug("verbose one")
    update_settings({"log_verbose_level": 1})
    log.debug("verbose two")
    update_settings({"log_info": False, "log_format": "ISO8601"})
    log.info("info three")
    log.warning("warning four")
    text = stream.getvalue()
    assert "verbose one" not in text and "verbose two" in text and "info three" not in text
    assert re.search(r"^I\d{4} .* verbose two$", text, re.M)  # VERBOSE prints as I
    assert re.search(r"^\d{4}-\d\d-\d\dT[\d:]+Z W \d+ test_log_settings\.py:\d+\] warning four$", text, re.M)
