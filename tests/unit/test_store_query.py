"""The store's one query builder: filters as placeholders and arguments, never as text."""

from __future__ import annotations

import pytest

from sn_monitor.controller.storage.query import Select


def test_no_filter_reads_the_whole_table() -> None:
    assert Select("nodes").statement() == ("SELECT * FROM nodes", ())


def test_filters_left_as_none_are_not_applied() -> None:
    select = (Select("actions").equal("node", "n1").equal("rule", None)
              .at_least("updated_at", 5.0).at_least("created_at", None)
              .order_by("created_at DESC", "rowid DESC").limit(10))
    assert select.statement() == (
        "SELECT * FROM actions WHERE node = ? AND updated_at >= ?"
        " ORDER BY created_at DESC, rowid DESC LIMIT ?", ("n1", 5.0, 10))


@pytest.mark.parametrize("value", ["n1' OR '1'='1", "50%", "a?b", 0])
def test_values_are_only_ever_arguments(value: object) -> None:
    sql, args = Select("events", "COUNT(*) AS n").equal("node", value).statement()
    assert sql == "SELECT COUNT(*) AS n FROM events WHERE node = ?"
    assert args == (value,)


def test_one_of_is_sorted_and_once_each() -> None:
    select = Select("actions").one_of("state", ["running", "pending", "running"])
    assert select.statement() == ("SELECT * FROM actions WHERE state IN (?, ?)",
                                  ("pending", "running"))
    assert not select.matches_nothing
    assert Select("actions").one_of("state", None).statement() == (
        "SELECT * FROM actions", ())


def test_one_of_nothing_matches_nothing() -> None:
    assert Select("recoveries").one_of("state", []).matches_nothing


def test_reordered_keeps_the_newest_then_orders_them_again() -> None:
    newest = Select("node_transitions").equal("node", "n1").order_by("id DESC").limit(3)
    assert newest.reordered("id") == (
        "SELECT * FROM (SELECT * FROM node_transitions WHERE node = ? ORDER BY id DESC"
        " LIMIT ?) AS newest ORDER BY id", ("n1", 3))
