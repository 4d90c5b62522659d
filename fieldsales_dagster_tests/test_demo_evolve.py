"""The demo API's data evolving between two runs (``Dataset.evolve``), and its eventId switch."""

from __future__ import annotations

import json

import pytest
import requests

from fieldsales_dagster.demo_api import DemoConfig, DemoServer
from fieldsales_dagster.demo_api.data import Dataset, from_wire

TX = "/public/v1/api/transaction/all"


def _items(dataset: Dataset, name: str) -> list[dict]:
    return [json.loads(from_wire(dataset.render(name, src, i))) for src, i in dataset.keys(name)]


def _dataset() -> Dataset:
    return Dataset(transactions=1200, events=30, event_groups=3, seed=5)


def test_evolve_is_deterministic_whatever_the_steps():
    stepwise, at_once = _dataset(), _dataset()
    stepwise.evolve(1)
    stepwise.evolve(2)
    at_once.evolve(2)
    for name in ("transactions", "events", "event_groups"):
        assert _items(stepwise, name) == _items(at_once, name)


@pytest.mark.parametrize("events", [400, 4000])
def test_a_fixed_number_of_changed_events_is_the_same_at_every_size(events):
    # ``--changed-events``: the benchmark compares two tenant sizes on the same changes.
    server = DemoServer(DemoConfig(transactions=events * 4, events=events, changed_events=40))
    changes = server.behaviour.evolve(1)
    assert (changes["events_evolved"], changes["events_deleted"], changes["events_added"]) == (
        40,
        4,
        4,
    )
    assert server.dataset.views["events"].count() == events


def test_evolve_changes_every_kind_of_thing_it_reports():
    dataset = _dataset()
    before = {name: _items(dataset, name) for name in ("transactions", "events", "event_groups")}
    changes = dataset.evolve(1)
    after = {name: _items(dataset, name) for name in before}

    old_tx = {t["_id"]: t for t in before["transactions"]}
    new_tx = {t["_id"]: t for t in after["transactions"]}
    assert len(new_tx.keys() - old_tx.keys()) == changes["transactions_added"] > 0
    assert len(old_tx.keys() - new_tx.keys()) == changes["transactions_deleted"] > 0
    changed = sum(old_tx[i] != new_tx[i] for i in old_tx.keys() & new_tx.keys())
    assert changed == changes["transactions_changed"] > 0
    old_ev = {e["_id"]: e for e in before["events"]}
    new_ev = {e["_id"]: e for e in after["events"]}
    assert len(new_ev.keys() - old_ev.keys()) == changes["events_added"] > 0
    assert len(old_ev.keys() - new_ev.keys()) == changes["events_deleted"] > 0
    advanced = [i for i in old_ev.keys() & new_ev.keys() if old_ev[i] != new_ev[i]]
    assert len(advanced) == changes["events_evolved"] > 0
    for event_id in advanced:
        old, new = old_ev[event_id], new_ev[event_id]
        assert len(new["eventStateHistory"]) == len(old["eventStateHistory"]) + 1
        assert new["eventState"] == new["eventStateHistory"][-1]["stateNew"]
    assert len(after["event_groups"]) == len(before["event_groups"]) + changes["event_groups_added"]


def test_evolved_data_filtered_by_event_id_returns_exactly_each_events_transactions():
    dataset = _dataset()
    dataset.evolve(2)
    by_event: dict[str, set[str]] = {}
    for t in _items(dataset, "transactions"):
        by_event.setdefault(t["eventId"], set()).add(t["_id"])
    for event_id in dataset.ids("events"):
        segments = dataset.transaction_segments(event_id, None)
        filtered = [
            json.loads(from_wire(dataset.render("transactions", src, i)))
            for src, a, b in segments
            for i in range(a, b)
        ]
        assert {t["eventId"] for t in filtered} <= {event_id}
        assert {t["_id"] for t in filtered} == by_event.get(event_id, set())


def test_single_changes_change_what_they_say_and_a_restored_event_comes_back_as_it_was():
    dataset = _dataset()

    def served(name: str) -> dict[str, dict]:
        return {item["_id"]: item for item in _items(dataset, name)}

    before, events = served("transactions"), served("events")
    event_id, (src, idx) = dataset.event_id(4), dataset.keys("transactions")[0]
    edited = json.loads(from_wire(dataset.render("transactions", src, idx)))["_id"]
    dataset.edit_transaction(src, idx)
    dataset.add_transactions([4, 4])
    after = served("transactions")
    assert after[edited]["productId"] != before[edited]["productId"]
    assert {i: t for i, t in after.items() if i != edited} == {
        **{i: t for i, t in before.items() if i != edited},
        **{i: t for i, t in after.items() if i not in before},
    }
    assert [t["eventId"] for i, t in after.items() if i not in before] == [event_id] * 2
    dataset.delete_event(4)
    assert event_id not in served("events")
    assert not any(t["eventId"] == event_id for t in served("transactions").values())
    dataset.restore_event(4)
    assert served("events") == events
    assert {i for i, t in served("transactions").items() if t["eventId"] == event_id} == {
        i for i, t in before.items() if t["eventId"] == event_id
    }
    dataset.advance_event(4)
    assert served("events")[event_id]["eventState"] != events[event_id]["eventState"]
    dataset.reconfigure(1, 0, ("Bewertung", "Slider", {"minimum": 0, "maximum": 50, "step": 1}))
    carried = [
        t["_customReport"]["_configcreatedTime"]
        for t in served("transactions").values()
        if t.get("_customReport", {}).get("_customReportConfig") == dataset.configs[1].config_id
        and "_configcreatedTime" in t["_customReport"]
    ]
    assert carried
    assert {c["customFields"][0]["config"]["fieldObject"]["maximum"] for c in carried} == {50}


def test_evolve_cannot_go_back():
    dataset = _dataset()
    dataset.evolve(2)
    with pytest.raises(ValueError, match="generation 2"):
        dataset.evolve(1)


def test_ignore_event_filter_serves_the_whole_list_for_any_event_id():
    with DemoServer(DemoConfig(transactions=300, seed=1)) as server:
        event_id = server.dataset.item("events", 2)["_id"]
        server.behaviour.ignore_event_filter = True
        body = requests.get(
            server.base_url + TX,
            params={"eventId": event_id, "limit": 1},
            headers={"Authorization": f"Bearer {server.token}"},
            timeout=10,
        ).json()
    assert body["count"] == 300
    assert body["debug"]["query"]["eventId"] == event_id
