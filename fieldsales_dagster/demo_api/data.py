"""The deterministic synthetic dataset served by the demo Field-Sales API.

Every item is generated on demand from ``(seed, kind, index)``: nothing per item is stored, so
memory does not grow with the number of transactions. What repeats (custom-report configurations,
per-field result fragments, products) is rendered to JSON text once and spliced per item.

The lists the server holds are *views*: segments of base indices plus a small overlay of inserted
items, so insertions and deletions in the middle of a run stay cheap (see ``ListView``).

This module follows the API document on its own; it imports nothing from the rest of the project.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any

LIST_NAMES = ("transactions", "events", "event_groups")

# --------------------------------------------------------------------------------------------
# Ids: opaque 24-hex strings, a seeded bijection of (kind, index) so they can be parsed back.

_BITS = 96
_MASK = (1 << _BITS) - 1
_M1 = 0x9E3779B97F4A7C15F39CC061
_M2 = 0xC2B2AE3D27D4EB4F165667B1
_M1_INV = pow(_M1, -1, 1 << _BITS)
_M2_INV = pow(_M2, -1, 1 << _BITS)
_IDX_BITS = 56
_IDX_MASK = (1 << _IDX_BITS) - 1

# Id kinds (also used as random-stream kinds).
K_TX = 1
K_TX_INS = 2
K_EVENT = 3
K_EVENT_INS = 4
K_GROUP = 5
K_GROUP_INS = 6
K_PHANTOM_EVENT = 7
K_PRODUCT = 8
K_USER = 9
K_POS = 10
K_PROJECT = 11
K_AREA = 12
K_CONFIG = 13
K_FIELD = 14
K_FIELD_ENTRY = 15
K_FILE = 16
K_INVOICE = 17
K_TIMES = 18
K_HISTORY = 19
K_AGENCY_USER = 20
K_CRR = 21
K_LOCGROUP = 22
K_CHANNEL = 23
K_UNKNOWN_FIELD = 24
K_POOL = 25
K_FILE_INS = 26
K_PLACE = 27
K_EVOLVE = 28
K_HISTORY_EVOLVED = 29
K_HISTORY_MORE = 30
K_FILE_EVENT = 31


class IdCodec:
    """Seeded, invertible map between ``(kind, index)`` and a 24-hex id."""

    def __init__(self, seed: int) -> None:
        digest = hashlib.blake2b(b"ids:%d" % seed, digest_size=12).digest()
        self._c = int.from_bytes(digest, "big")

    def make(self, kind: int, idx: int) -> str:
        x = (((kind << _IDX_BITS) | idx) * _M1) & _MASK
        x ^= x >> 48
        x = (x * _M2) & _MASK
        x ^= x >> 48
        return "%024x" % ((x + self._c) & _MASK)

    def parse(self, text: str) -> tuple[int, int] | None:
        if not isinstance(text, str) or len(text) != 24:
            return None
        try:
            x = int(text, 16)
        except ValueError:
            return None
        x = (x - self._c) & _MASK
        x ^= x >> 48
        x = (x * _M2_INV) & _MASK
        x ^= x >> 48
        x = (x * _M1_INV) & _MASK
        return x >> _IDX_BITS, x & _IDX_MASK


class Rng:
    """64 deterministic random bytes per ``(kind, index)``."""

    def __init__(self, seed: int) -> None:
        self._base = hashlib.blake2b(b"rng:%d" % seed, digest_size=64)

    def bytes(self, kind: int, idx: int) -> bytes:
        h = self._base.copy()
        h.update(((kind << _IDX_BITS) | idx).to_bytes(8, "little"))
        return h.digest()


# --------------------------------------------------------------------------------------------
# Timestamps: milliseconds since BASE, formatted without datetime on the hot path.

BASE = datetime(2024, 1, 1, tzinfo=UTC)
_DAYS = [(BASE + timedelta(days=k)).strftime("%Y-%m-%d") for k in range(4000)]
DAY_MS = 86_400_000
HOUR_MS = 3_600_000
# Events are spread over this window; events after NOW_DAY have not happened yet.
FIRST_DAY = 180
SPAN_DAYS = 450
NOW_DAY = FIRST_DAY + 330


_HHMM = [f"{m // 60:02d}:{m % 60:02d}" for m in range(1440)]
_SSMS = [f"{r // 1000:02d}.{r % 1000:03d}" for r in range(60_000)]


def ts(ms: int) -> str:
    d, r = divmod(ms, DAY_MS)
    m, r = divmod(r, 60_000)
    return f"{_DAYS[d]}T{_HHMM[m]}:{_SSMS[r]}Z"


def _num(x: float) -> str:
    """JSON text of a number: integers without a fraction, floats rounded to 6 places."""
    if float(x).is_integer():
        return str(int(x))
    return repr(round(x, 6))


def _dumps(obj: object) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, check_circular=False)


def wire(text: str) -> str:
    """``text`` as *wire text*: its UTF-8 bytes, one ``str`` character per byte.

    Rendered items are wire text, so a page of them becomes the UTF-8 body with
    ``.encode("latin-1")``, a plain copy, instead of a slow UTF-8 transcoding of megabytes.
    """
    return text if text.isascii() else text.encode().decode("latin-1")


def from_wire(text: str) -> str:
    return text.encode("latin-1").decode()


# --------------------------------------------------------------------------------------------
# Static vocabularies.

FIRST_NAMES = [
    "Anna", "Lukas", "Marie", "Jonas", "Sophie", "Felix", "Lea", "Paul", "Emma", "Leon",
    "Mia", "Noah", "Hannah", "Elias", "Lena", "Finn", "Clara", "Ben", "Zoé", "Jürgen",
]  # fmt: skip
LAST_NAMES = [
    "Müller", "Schmidt", "Schneider", "Fischer", "Weber", "Meyer", "Wagner", "Becker",
    "Schulz", "Hoffmann", "Koch", "Richter", "Klein", "Wolf", "Schröder", "Neumann",
]  # fmt: skip
LANGUAGES = ["de", "de", "de", "en", "fr", "it", "nl"]
CITIES = [
    # name, postal prefix, lat, lng, districts
    ("Berlin", "10", 52.520, 13.405, ["Mitte", "Prenzlauer Berg", "Neukölln", "Spandau"]),
    ("Hamburg", "20", 53.551, 9.993, ["Altona", "Eimsbüttel", "Harburg", "Wandsbek"]),
    ("München", "80", 48.137, 11.575, ["Schwabing", "Pasing", "Giesing", "Sendling"]),
    ("Köln", "50", 50.937, 6.960, ["Ehrenfeld", "Deutz", "Nippes", "Kalk"]),
    ("Frankfurt am Main", "60", 50.110, 8.682, ["Bornheim", "Sachsenhausen", "Höchst"]),
    ("Stuttgart", "70", 48.775, 9.182, ["Bad Cannstatt", "Vaihingen", "Feuerbach"]),
    ("Leipzig", "04", 51.339, 12.373, ["Plagwitz", "Gohlis", "Connewitz"]),
    ("Wien", "11", 48.208, 16.373, ["Favoriten", "Floridsdorf", "Leopoldstadt"]),
]
CHAINS = ["REWE", "EDEKA", "Kaufland", "Globus", "Marktkauf", "Netto", "tegut", "Billa"]
STREETS = ["Hauptstraße", "Bahnhofstraße", "Lindenweg", "Marktplatz", "Schillerstraße", "Ringstr."]
AREA_NAMES = ["Nord", "Süd", "Ost", "West", "Mitte", "Nordost", "Südwest", "Metropol"]
LOCATION_GROUP_NAMES = ["Key Account", "Großfläche", "Supermarkt", "Discounter", "Getränkemarkt"]
TEXT_WORDS = [
    "sehr gut", "Kunde interessiert", "Regal leer", "Display fehlt", "ok", "Nachbestellung",
    "Aktion verlängert", "kein Kontakt", "Verkostung gut besucht", "Preis zu hoch",
]  # fmt: skip
PROJECTS = [
    ("Spring Tasting Tour 2025", "STT"),
    ("Coffee Roadshow", "CRS"),
    ("Summer Drinks Promotion", "SDP"),
    ("Wine Weeks Q4", "WWQ"),
]
PRODUCTS = [
    # name, price, has proxy name
    ("Apfelschorle 0,5l", 1.29, False), ("Cold Brew Original 250ml", 2.49, True),
    ("Espresso Bohnen 1kg", 16.99, False), ("Riesling trocken 0,75l", 7.95, True),
    ("Mate Zitrone 0,33l", 1.59, False), ("Pinot Noir 0,75l", 11.5, True),
    ("Hafer Barista 1l", 2.19, False), ("Ingwer Shot 60ml", 1.99, True),
    ("Crema Kapseln 10er", 3.79, False), ("Rosé Secco 0,75l", 6.49, False),
    ("Zitronenlimo 1l", 1.09, False), ("Grauburgunder 0,75l", 8.9, True),
    ("Probierpaket Sommer", 0, True), ("Eistee Pfirsich 0,5l", 0.99, False),
    ("Filterkaffee 500g", 5.49, False), ("Gin Tonic Dose", 2.99, True),
]  # fmt: skip
STATE_PATHS_FUTURE = [
    ["Planned", "Published"],
    ["Planned", "Published", "Accepted"],
    ["Planned", "Published", "Rejected", "Published"],
]
#: The state an evolved event moves to next (``Dataset.evolve``).
NEXT_STATE = {
    "Planned": "Published",
    "Published": "Accepted",
    "Rejected": "Published",
    "Accepted": "LoggedIn",
    "LoggedIn": "LoggedOut",
    "LoggedOut": "SalesReport",
    "SalesReport": "SalesReportUploaded",
    "SalesReportUploaded": "SalesReportAccepted",
    "SalesReportAccepted": "Invoiced",
    "Invoiced": "Paid",
    "Paid": "Invoiced",
}
STATE_PATHS_PAST = [
    ["Planned", "Published", "Accepted", "LoggedIn", "LoggedOut"],
    ["Planned", "Published", "SalesReport", "SalesReportUploaded", "SalesReportAccepted"],
    ["Planned", "SalesReportUploaded", "SalesReportAccepted", "Invoiced", "Paid"],
    ["Planned", "Published", "Accepted", "SalesReport"],
    ["Planned", "Published", "Rejected", "Published", "Accepted"],
    ["Planned", "Published"],
]


# --------------------------------------------------------------------------------------------
# How heavy the items are.


@dataclass(frozen=True)
class Shape:
    """The weight of the generated items; the defaults are the demo's (``PROFILES``).

    ``events_per_pos``: events per point of sale (each event embeds its own copy of it).
    ``status_history``: at least this many ``eventStateHistory`` entries per event (0: the 2-5 of
    the state path; more are Published/Rejected rounds after the first entry).
    ``event_reports``: custom reports on every event (0: one or two, on ~40% of the events).
    ``report_fields``: each custom-report configuration's fields, repeated this many times, so
    this many times the results per transaction and per event report (at 8: 48-64 fields, the
    size of a long survey form).
    ``pos_extra_fields``: extra attributes in every point-of-sale object's ``genericFields``.
    ``tx_per_event``: transactions per event when the size names transactions only (the events
    default to ``transactions // tx_per_event``); each event's transactions are consecutive.
    ``undated_events``: percent of the events served with an empty ``eventStateHistory`` (their
    ``eventStateTimestamps`` kept), as some tenants serve their events.
    """

    events_per_pos: int = 4
    status_history: int = 0
    event_reports: int = 0
    report_fields: int = 1
    pos_extra_fields: int = 0
    tx_per_event: int = 40
    undated_events: int = 0

    def __post_init__(self) -> None:
        limits = {
            "events_per_pos": (1, 10_000),
            "status_history": (0, 200),
            "event_reports": (0, 8),
            "report_fields": (1, 8),
            "pos_extra_fields": (0, 1000),
            "tx_per_event": (1, 100_000),
            "undated_events": (0, 100),
        }
        for name, (lo, hi) in limits.items():
            value = getattr(self, name)
            if not lo <= value <= hi:
                raise ValueError(f"shape: {name} must be {lo}..{hi}, got {value}")


#: Named shapes: ``demo`` (the default, small and uniform) and ``heavy`` (a real tenant's weight:
#: event payloads about 4x the demo's, twice the custom-report results per transaction). The
#: others change one knob of ``demo`` each, so that a cost that grows on one names its cause:
#:
#: * ``many-events``: 4 transactions per event (short visits, a few sales each): per-event work;
#: * ``few-events``: 400 transactions per event (long promotions): per-transaction work;
#: * ``long-history``: 100 status changes per event (events rejected and re-published often);
#: * ``deep-reports``: configurations of 48-64 fields (long survey forms): 8x the custom-report
#:   results per transaction and per event report;
#: * ``wide-events``: 300 custom point-of-sale fields in every event (a CRM-fed store master).
PROFILES = {
    "demo": Shape(),
    "heavy": Shape(
        events_per_pos=25,
        status_history=20,
        event_reports=4,
        report_fields=2,
        pos_extra_fields=48,
    ),
    "many-events": Shape(tx_per_event=4),
    "few-events": Shape(tx_per_event=400),
    "long-history": Shape(status_history=100),
    "deep-reports": Shape(report_fields=8),
    "wide-events": Shape(pos_extra_fields=300),
}

# --------------------------------------------------------------------------------------------
# Custom-report configurations.

FILE = object()  # pool sentinel: a per-transaction file reference id goes here
_FILE_MARK = "\x00"

_VISIBILITY = {
    "conditions": {
        "productGroups": [],
        "products": [],
        "hideForDealerRanks": [],
        "field": {"type": "", "operator": "", "rKey": "", "conditions": []},
    },
    "config": {"multiplyForEachCondition": False, "groupByConditions": False},
}

# (config name, type, transactionConfig or None, fields); a field is (name, fieldType, params).
ConfigSpec = tuple[str, str, dict[str, Any] | None, list[tuple[str, str, dict[str, Any]]]]
CONFIG_SPECS: list[ConfigSpec] = [
    (
        "Verkostung Feedback",
        "transactionFixedProduct",
        {"useQty1": True},
        [
            ("Geschmack", "Slider", {"minimum": 0, "maximum": 10, "step": 1}),
            ("Kaufbereitschaft", "Slider", {"minimum": 0, "maximum": 100, "step": 5}),
            ("Regalfoto", "upload", {}),
            ("Probierbecher", "number", {}),
            ("Kommentar", "text", {}),
            ("Kunde kennt Marke", "checkbox", {}),
            ("Kassenbon-Nr.", "text", {}),
        ],
    ),
    (
        "Sales Report Kaffee",
        "sales",
        None,
        [
            ("Bewertung", "Slider", {"minimum": 0, "maximum": 5, "step": 0.1}),
            ("Displayfoto", "upload", {}),
            ("Verkaufte Gebinde", "number", {}),
            ("Filialnummer", "text", {}),
            ("Platzierung OK", "checkbox", {}),
            ("Temperatur", "Slider", {"minimum": -5, "maximum": 35, "step": 0.5}),
        ],
    ),
    (
        "Promotion Check",
        "transactionFixedProduct",
        {"useQty1": False},
        [
            ("Anteil Sichtfläche", "Slider", {"minimum": 0, "maximum": 100, "step": 5}),
            ("Foto Aktion", "upload", {}),
            ("Facings", "number", {}),
            ("Wettbewerb Aktion", "checkbox", {}),
            ("Postleitzahl Kunde", "text", {}),
            ("Gesamteindruck", "Slider", {"minimum": 0, "maximum": 1, "step": 0.1}),
        ],
    ),
    (
        "Weinprobe",
        "sales",
        {"useQty1": False},
        [
            ("Trockenheit", "Slider", {"minimum": 1, "maximum": 9, "step": 1}),
            ("Flaschenfoto", "upload", {}),
            ("Probiermenge ml", "number", {}),
            ("Notiz", "text", {}),
            ("Kundennummer", "text", {}),
            ("Wiederkauf", "checkbox", {}),
            ("Preisgefühl", "Slider", {"minimum": 0, "maximum": 10, "step": 0.1}),
            ("Zusatzfoto", "upload", {}),
        ],
    ),
]


def _slug(name: str) -> str:
    out = []
    for ch in name.lower():
        if ch.isalnum() and ch.isascii():
            out.append(ch)
        elif ch in "äöü":
            out.append({"ä": "ae", "ö": "oe", "ü": "ue"}[ch])
        elif out and out[-1] != "-":
            out.append("-")
    return "".join(out).strip("-")


@dataclass
class Field:
    field_id: str
    name: str
    field_type: str
    params: dict
    required: bool
    pool: list  # 256 entries: JSON text of a value, None (absent) or FILE
    pre: str  # '"<id>":{"value":'
    suf: str  # ',"name":"<name>"}'
    suf_id: str  # ',"name":"<name>","fieldId":"<id>"}'


@dataclass
class Config:
    config_id: str
    name: str
    type: str
    fields: list[Field]
    obj: dict
    tail_flat: str  # closes reportResults, adds config id and the config, closes the transaction
    tail_nested: str
    # Per fieldId variant (without, with), per field: 256 ready result entries, each with a
    # leading comma; "" where the value is absent, _FILE_MARK where a file id goes in.
    entries: tuple[list[list[str]], ...]  # (without fieldId, with fieldId)
    uploads: list[tuple[int, str, str, str]]  # (position, pre, suf, suf_id) of upload fields


def _value_pool(rng_bytes: bytes, field_type: str, params: dict, required: bool) -> list:
    """256 weighted value variants for one field, mostly valid, with the documented quirks."""
    pool: list = []
    b = rng_bytes
    for j in range(256):
        r = b[j % 64] ^ (j * 37 & 0xFF)
        if not required and j % 11 == 3:
            pool.append(None)
            continue
        if field_type == "Slider":
            lo, hi, step = params["minimum"], params["maximum"], params["step"]
            n_steps = round((hi - lo) / step)
            k = (r * 7 + j) % (n_steps + 1)
            v = lo + k * step
            if j % 23 == 5:  # out of range
                v = hi + step * (1 + j % 3) if j % 2 else lo - step
                pool.append(_num(v))
            elif j % 29 == 7:  # off step
                pool.append(_num(min(v + step / 2, hi - step / 2)))
            elif j % 13 == 2:  # numeric string
                pool.append(json.dumps(_num(v)))
            else:
                pool.append(_num(v))
        elif field_type == "number":
            v = (r * 3 + j) % 60
            if j % 7 == 1:
                pool.append(json.dumps(f"{v}.5"))  # numeric string, "12.5"
            elif j % 5 == 2:
                pool.append(_num(v + 0.25))
            else:
                pool.append(str(v))
        elif field_type == "text":
            if j % 6 == 0:
                pool.append(json.dumps(f"{r * 41 + j:05d}"))  # digits, leading zeros kept
            elif j % 6 == 1:
                pool.append(json.dumps(str(1000 + r * 7)))
            else:
                pool.append(json.dumps(TEXT_WORDS[(r + j) % len(TEXT_WORDS)], ensure_ascii=False))
        elif field_type == "upload":
            pool.append(FILE)
        else:  # checkbox: a kind the API document does not name
            pool.append(("true", "false", '"yes"', "false")[(r + j) % 4])
    return pool


def build_configs(
    ids: IdCodec, rng: Rng, config_specs: list[ConfigSpec], report_fields: int = 1
) -> list[Config]:
    """The configurations; ``report_fields`` > 1 repeats each one's fields (numbered copies)."""
    configs = []
    fno = 0
    for ci, (cname, ctype, tconfig, base_specs) in enumerate(config_specs):
        cid = ids.make(K_CONFIG, ci)
        specs = [
            (f"{fname} {copy + 1}" if copy else fname, ftype, params)
            for copy in range(report_fields)
            for fname, ftype, params in base_specs
        ]
        entries = []
        fields: list[Field] = []
        for k, (fname, ftype, params) in enumerate(specs):
            fid = ids.make(K_FIELD, fno)
            required = k % 3 == 0
            created = ts((20 + ci * 30) * DAY_MS + 9 * HOUR_MS + k * 61_000)
            if ftype == "Slider":
                fobj = {"options": [], **params}
            elif ftype == "upload":
                fobj = {
                    "options": [],
                    "config": {"forceGps": k % 2 == 0, "preferMetaGpsLocationData": k % 4 == 1},
                }
            elif ftype == "checkbox":
                fobj = {"options": ["ja", "nein"]}
            else:
                fobj = {"options": []}
            entries.append(
                {
                    "_id": ids.make(K_FIELD_ENTRY, fno),
                    "config": {
                        "_id": fid,
                        "name": fname,
                        "fieldType": ftype,
                        "slug": _slug(fname),
                        "toolTipTxt": "" if k % 2 else f"Bitte {fname} angeben",
                        "description": "",
                        "active": k != 7,
                        "enableHintOnClick": k % 4 == 0,
                        "created": created,
                        "fieldObject": fobj,
                    },
                    "required": required,
                    "pdf": k % 2 == 0,
                    "requiredByFieldId": fields[0].field_id if k == 4 else None,
                    "relatedReport": None,
                    "layout": {"cols": 12 if ftype == "text" else 6, "rows": 1, "inline": 0},
                    "visibility": _VISIBILITY,
                }
            )
            name_json = json.dumps(fname, ensure_ascii=False)
            fields.append(
                Field(
                    field_id=fid,
                    name=fname,
                    field_type=ftype,
                    params=params,
                    required=required,
                    pool=_value_pool(rng.bytes(K_POOL, fno), ftype, params, required),
                    pre=f'"{fid}":{{"value":',
                    suf=f',"name":{name_json}}}',
                    suf_id=f',"name":{name_json},"fieldId":"{fid}"}}',
                )
            )
            fno += 1
        obj: dict = {"_id": cid, "type": ctype, "name": cname}
        if tconfig is not None:
            obj["transactionConfig"] = tconfig
        obj["customFields"] = entries
        text = _dumps(obj)
        variants = tuple(
            [
                [
                    ""
                    if v is None
                    else _FILE_MARK
                    if v is FILE
                    else wire("," + f.pre + v + (f.suf_id if with_id else f.suf))
                    for v in f.pool
                ]
                for f in fields
            ]
            for with_id in (False, True)
        )
        uploads = [
            (k, wire(f.pre), wire(f.suf), wire(f.suf_id))
            for k, f in enumerate(fields)
            if f.field_type == "upload"
        ]
        configs.append(
            Config(
                config_id=cid,
                name=cname,
                type=ctype,
                fields=fields,
                obj=obj,
                tail_flat=wire(f'}},"_customReportConfig":"{cid}","_configcreatedTime":{text}}}}}'),
                tail_nested=wire(
                    f'}},"_customReportConfig":"{cid}",'
                    f'"_customReport":{{"_configcreatedTime":{text}}}}}}}'
                ),
                entries=variants,
                uploads=uploads,
            )
        )
    return configs


# --------------------------------------------------------------------------------------------
# List views: base indices plus a small overlay of inserted items.

BASE_SRC = 0
INS_SRC = 1


class ListView:
    """The current order of one list: segments ``(src, start, stop)`` of base or inserted items."""

    def __init__(self, base_count: int) -> None:
        self.base_count = base_count
        self.segments: list[tuple[int, int, int]] = (
            [(BASE_SRC, 0, base_count)] if base_count else []
        )
        self.inserted = 0
        self._lock = threading.Lock()

    def count(self) -> int:
        return sum(b - a for _, a, b in self.segments)

    def mutate(self, insert: int = 0, delete: int = 0, at: int = 0) -> None:
        with self._lock:
            segs = list(self.segments)
            if delete:
                segs = _cut(segs, at, at + delete)
            if insert:
                start = self.inserted
                self.inserted += insert
                head = _cut(segs, at, 1 << 62)
                tail = _cut(segs, 0, at)
                segs = head + [(INS_SRC, start, start + insert)] + tail
            self.segments = segs  # readers take the list reference; never mutated in place

    def keys(self) -> Iterator[tuple[int, int]]:
        for src, a, b in self.segments:
            for i in range(a, b):
                yield src, i

    def contains(self, src: int, idx: int) -> bool:
        return any(s == src and a <= idx < b for s, a, b in self.segments)

    def remove(self, src: int, lo: int, hi: int, keep: Callable[[int], bool] | None = None) -> int:
        """Remove the items ``lo..hi`` of ``src`` wherever they are, except those ``keep`` spares.

        Returns how many were removed.
        """
        with self._lock:
            out: list[tuple[int, int, int]] = []
            removed = 0
            for s, a, b in self.segments:
                if s != src or b <= lo or a >= hi:
                    out.append((s, a, b))
                    continue
                if a < lo:
                    out.append((s, a, lo))
                for i in range(max(a, lo), min(b, hi)):
                    if keep is not None and keep(i):
                        out.append((s, i, i + 1))
                    else:
                        removed += 1
                if b > hi:
                    out.append((s, hi, b))
            self.segments = out
            return removed

    def restore(self, src: int, lo: int, hi: int) -> int:
        """List the items ``lo..hi`` of ``src`` that are not listed again, at the list's end.

        Returns how many came back.
        """
        with self._lock:
            back = [(src, i, i + 1) for i in range(lo, hi) if not self.contains(src, i)]
            self.segments = self.segments + back
            return len(back)


def _cut(segs: list[tuple[int, int, int]], lo: int, hi: int) -> list[tuple[int, int, int]]:
    """The segments with list positions ``lo..hi`` removed."""
    out = []
    pos = 0
    for src, a, b in segs:
        n = b - a
        s0, s1 = pos, pos + n
        if s1 <= lo or s0 >= hi:
            out.append((src, a, b))
        else:
            if s0 < lo:
                out.append((src, a, a + (lo - s0)))
            if s1 > hi:
                out.append((src, a + (hi - s0), b))
        pos = s1
    return out


def take(segs: list[tuple[int, int, int]], skip: int, limit: int) -> list[tuple[int, int]]:
    """Keys at list positions ``skip .. skip+limit``."""
    out: list[tuple[int, int]] = []
    if limit <= 0:
        return out
    for src, a, b in segs:
        n = b - a
        if skip >= n:
            skip -= n
            continue
        stop = min(b, a + skip + limit - len(out))
        out.extend((src, i) for i in range(a + skip, stop))
        skip = 0
        if len(out) >= limit:
            break
    return out


# --------------------------------------------------------------------------------------------
# The dataset.

_ID_KINDS = {
    "transactions": (K_TX, K_TX_INS),
    "events": (K_EVENT, K_EVENT_INS),
    "event_groups": (K_GROUP, K_GROUP_INS),
}


class Dataset:
    """Counts, ids and JSON rendering of every list the demo server holds."""

    ORPHAN_EVERY = 1000  # one transaction in this many references an event that does not exist
    #: With ``numeric_event_ids``, event ``e`` (inserted ones after the base ones) is this + e.
    NUMERIC_EVENT_ID_BASE = 1000

    def __init__(
        self,
        transactions: int,
        events: int,
        event_groups: int,
        seed: int,
        shape: Shape = Shape(),
        numeric_event_ids: bool = False,
        changed_events: int | None = None,
    ) -> None:
        self.n_tx = transactions
        #: Base events advanced per generation (default 1%, at least 3), a tenth as many deleted
        #: and added: a fixed number compares tenants of several sizes on the same changes.
        self.changed_events = changed_events
        #: Events' ``_id`` as JSON numbers (``1002``), as some instances send them; transactions
        #: then carry ``eventId`` as a number or as its digits in a string, alternately.
        self.numeric_event_ids = numeric_event_ids
        self.n_events = events
        self.n_groups = event_groups
        self.seed = seed
        self.codec = IdCodec(seed)
        self.rng = Rng(seed)
        self.shape = shape
        #: What ``reconfigure`` edits; ``configs`` is built from it.
        self.config_specs = list(CONFIG_SPECS)
        self.configs = build_configs(self.codec, self.rng, self.config_specs, shape.report_fields)
        #: Transaction file ids are ``idx * stride + field position``: unique per field.
        self._file_stride = max(16, max(len(c.fields) for c in self.configs))
        self.views = {
            "transactions": ListView(transactions),
            "events": ListView(events),
            "event_groups": ListView(event_groups),
        }
        self._orphan_r = self.rng.bytes(K_PHANTOM_EVENT, 0)[0] * 997 % self.ORPHAN_EVERY
        self._products = []
        for k, (pname, price, proxy) in enumerate(PRODUCTS):
            pid = self.codec.make(K_PRODUCT, k)
            proxy_part = wire(',"proxyProductName":' + json.dumps(pname, ensure_ascii=False))
            self._products.append((pid, _num(price), proxy_part if proxy else ""))
        self._n_pos = max(1, events // shape.events_per_pos)
        self._n_users = max(12, events // 8)
        self.event_id = lru_cache(maxsize=8192)(self._event_id)
        self.event_timing = lru_cache(maxsize=8192)(self._event_timing)
        self._qty = [
            _num(q)
            for q in ([1] * 90 + [2] * 60 + [3] * 30 + [4, 5, 6, 8, 10, 12] * 10 + [0.5, 1.5] * 8)
        ]
        self._qty += ["1"] * (256 - len(self._qty))
        self._credits = ["0"] * 240 + [_num(x) for x in (1.29, 2.5, 5, 7.95, 10, 0.99) * 3][:16]
        #: How many times ``evolve`` ran.
        self.generation = 0
        #: Base event -> how many times ``evolve`` advanced its state.
        self.event_version: dict[int, int] = {}
        #: Base event -> how many points of sale ``move_event`` moved it on.
        self.event_moves: dict[int, int] = {}
        #: Base event -> how many times ``reassign_event`` gave it other users.
        self.event_reassigned: dict[int, int] = {}
        #: Inserted transaction -> its event, set by ``evolve`` (``n_events + i``: inserted event
        #: ``i``); other inserted transactions belong to a random base event.
        self.tx_event: dict[int, int] = {}
        #: Transaction ``(src, index)`` -> how many times ``edit_transaction`` edited it.
        self.tx_edits: dict[tuple[int, int], int] = {}

    # ---- views -----------------------------------------------------------------------------

    def count(self, name: str) -> int:
        return self.views[name].count()

    def ids(self, name: str) -> Iterator[str]:
        """The ``_id`` of every item of list ``name`` currently on the server, in list order."""
        for src, a, b in self.views[name].segments:
            for i in range(a, b):
                yield self.item_id(name, src, i)

    def keys(self, name: str, skip: int = 0, limit: int | None = None) -> list[tuple[int, int]]:
        """``(src, index)`` keys of list positions ``skip..skip+limit``."""
        segs = self.views[name].segments
        return take(segs, skip, self.count(name) if limit is None else limit)

    def item(self, name: str, position: int) -> dict:
        """The item at ``position`` of list ``name``, parsed (for tests and debugging)."""
        keys = self.keys(name, position, 1)
        if not keys:
            raise IndexError(position)
        return json.loads(from_wire(self.render(name, *keys[0])))

    def item_id(self, name: str, src: int, idx: int) -> str:
        if name == "events" and src == BASE_SRC:
            return self.event_id(idx)
        if name == "events":
            return self._ins_event_id(self.n_events + idx)
        return self.codec.make(_ID_KINDS[name][src], idx)

    def render(self, name: str, src: int, idx: int) -> str:
        """JSON of one item as wire text (see ``wire``)."""
        if name == "transactions":
            return self.render_transaction(src, idx)
        if name == "events":
            return self.render_event(src, idx)
        return self.render_group(src, idx)

    # ---- evolution between runs ---------------------------------------------------------------

    def evolve(self, generation: int) -> dict[str, int]:
        """Advance the data generation by generation up to ``generation``; returns what changed.

        In each generation, over the base events still listed (ranked by a seeded hash):

        * 1% of them (at least 3; ``changed_events`` where set) advance their state one step (a
          new ``eventStateHistory`` entry, ``eventState``, ``eventStateTimestamps``) and every
          other transaction of theirs may change (``qty``, ``exportDetails.processed``); one in
          three of them gains two transactions, one in three loses one;
        * 0.1% (at least 1; a tenth of ``changed_events``) of the others are deleted, with their
          transactions;
        * as many new events arrive, three new transactions each;
        * 1% more event groups (at least 1) are listed.

        Deterministic: the same seed and generation give the same data, whatever steps led there.
        """
        if generation < self.generation:
            raise ValueError(f"already at generation {self.generation}; cannot go back")
        summary = dict.fromkeys(
            ("events_evolved", "events_deleted", "events_added", "transactions_changed",
             "transactions_added", "transactions_deleted", "event_groups_added"), 0
        )  # fmt: skip
        while self.generation < generation:
            self.generation += 1
            for key, value in self._evolve_once(self.generation).items():
                summary[key] += value
        return summary

    def delete_event(self, e: int) -> int:
        """Delete base event ``e`` and its transactions; returns how many transactions went."""
        txs = self.views["transactions"]
        self.views["events"].remove(BASE_SRC, e, e + 1)
        lo, hi = self.event_block(e)
        removed = txs.remove(BASE_SRC, lo, hi, keep=self.is_orphan)
        inserted = [i for src, a, b in txs.segments if src == INS_SRC for i in range(a, b)]
        for i in inserted:
            if self.tx_event_index(INS_SRC, i) == e:
                removed += txs.remove(INS_SRC, i, i + 1)
        return removed

    # ---- single changes (for tests that choose their own; evolve is made of the first two) ----
    # They change how items render without a new generation: not for a prerendered server.

    def advance_event(self, e: int) -> None:
        """Base event ``e`` moves one state on; every other transaction of its changes."""
        self.event_version[e] = self.event_version.get(e, 0) + 1

    def move_event(self, e: int) -> None:
        """Base event ``e`` moves to the next point of sale; its transactions stay as they are."""
        self.event_moves[e] = self.event_moves.get(e, 0) + 1

    def reassign_event(self, e: int) -> None:
        """Base event ``e`` is assigned the next users; its transactions stay as they are."""
        self.event_reassigned[e] = self.event_reassigned.get(e, 0) + 1

    def add_transactions(self, events: list[int]) -> None:
        """A new transaction for each of ``events`` (``n_events + i``: inserted event ``i``)."""
        txs = self.views["transactions"]
        first = txs.inserted
        txs.mutate(insert=len(events), at=txs.count())
        for j, e in enumerate(events):
            self.tx_event[first + j] = e

    def edit_transaction(self, src: int, idx: int) -> None:
        """Transaction ``(src, idx)`` is edited in place: another product, at another price."""
        self.tx_edits[src, idx] = self.tx_edits.get((src, idx), 0) + 1

    def restore_event(self, e: int) -> int:
        """List deleted base event ``e`` again, the same id, with the base transactions it was
        generated with; returns how many transactions came back."""
        self.views["events"].restore(BASE_SRC, e, e + 1)
        return self.views["transactions"].restore(BASE_SRC, *self.event_block(e))

    def reconfigure(self, config: int, field: int, spec: tuple[str, str, dict[str, Any]]) -> None:
        """The tenant edits field ``field`` of configuration ``config`` (its id kept) into ``spec``
        (name, fieldType, params, as in ``CONFIG_SPECS``): every transaction and event report
        carries the new definition, and values of its kind, from now on."""
        cname, ctype, tconfig, fields = self.config_specs[config]
        fields = [*fields[:field], spec, *fields[field + 1 :]]
        self.config_specs[config] = (cname, ctype, tconfig, fields)
        self.configs = build_configs(
            self.codec, self.rng, self.config_specs, self.shape.report_fields
        )

    def _evolve_once(self, k: int) -> dict[str, int]:
        events, txs = self.views["events"], self.views["transactions"]
        listed = [i for src, a, b in events.segments if src == BASE_SRC for i in range(a, b)]
        listed.sort(key=lambda e: self.rng.bytes(K_EVOLVE, (k << 40) | e)[:8])
        n_evolve = min(len(listed), self.changed_events or max(3, self.n_events // 100))
        gone = self.changed_events // 10 if self.changed_events else self.n_events // 1000
        n_delete = min(len(listed) - n_evolve, max(1, gone))
        evolved, deleted = listed[:n_evolve], listed[n_evolve : n_evolve + n_delete]
        out = dict.fromkeys(("transactions_changed", "transactions_deleted"), 0)
        new_tx_events: list[int] = []
        for rank, e in enumerate(evolved):
            version = self.event_version.get(e, 0) + 1
            lo, hi = self.event_block(e)
            touched = [
                i
                for i in range(lo, hi)
                if (i + version) % 2 == 0 and not self.is_orphan(i) and txs.contains(BASE_SRC, i)
            ]
            before = [self.render_transaction(BASE_SRC, i) for i in touched]
            self.advance_event(e)
            out["transactions_changed"] += sum(
                self.render_transaction(BASE_SRC, i) != text
                for i, text in zip(touched, before, strict=True)
            )
            if rank % 3 == 0:
                new_tx_events += [e, e]
            elif rank % 3 == 1:
                for i in range(lo, hi):
                    if not self.is_orphan(i) and txs.contains(BASE_SRC, i):
                        out["transactions_deleted"] += txs.remove(BASE_SRC, i, i + 1)
                        break
        for e in deleted:
            out["transactions_deleted"] += self.delete_event(e)
        first_new = events.inserted
        events.mutate(insert=n_delete, at=events.count())
        for j in range(n_delete):
            new_tx_events += [self.n_events + first_new + j] * 3
        self.add_transactions(new_tx_events)
        groups = self.views["event_groups"]
        n_groups = max(1, self.n_groups // 100)
        groups.mutate(insert=n_groups, at=groups.count())
        return {
            **out,
            "events_evolved": n_evolve,
            "events_deleted": n_delete,
            "events_added": n_delete,
            "transactions_added": len(new_tx_events),
            "event_groups_added": n_groups,
        }

    # ---- transactions ----------------------------------------------------------------------

    def is_orphan(self, i: int) -> bool:
        return i % self.ORPHAN_EVERY == self._orphan_r

    def tx_event_index(self, src: int, idx: int) -> int:
        if src == BASE_SRC:
            return idx * self.n_events // self.n_tx
        if idx in self.tx_event:
            return self.tx_event[idx]
        d = self.rng.bytes(K_TX_INS, idx)
        return int.from_bytes(d[56:60], "big") % self.n_events

    def event_block(self, e: int) -> tuple[int, int]:
        """Base transaction indices ``lo..hi`` whose event is base event ``e``."""
        t, n = self.n_tx, self.n_events
        return (e * t + n - 1) // n, ((e + 1) * t + n - 1) // n

    def transaction_segments(
        self, event_id: str | None, type_: str | None
    ) -> list[tuple[int, int, int]]:
        """Segments of the transaction list matching the ``eventId`` and ``type`` filters.

        Every transaction is a sale: ``type`` other than ``sale`` matches nothing.
        """
        segs = self.views["transactions"].segments
        if type_ not in (None, "", "sale"):
            return []
        if event_id is None:
            return segs
        parsed = self._parse_event_id(event_id) or self.codec.parse(event_id)
        if parsed is None:
            return []
        kind, e = parsed
        out: list[tuple[int, int, int]] = []
        if kind == K_EVENT_INS:  # only ``evolve`` gives inserted events transactions
            e += self.n_events
            for src, a, b in segs:
                if src == INS_SRC:
                    out.extend(
                        (INS_SRC, i, i + 1) for i in range(a, b) if self.tx_event.get(i) == e
                    )
            return out
        if kind == K_PHANTOM_EVENT and e < self.n_tx and self.is_orphan(e):
            for src, a, b in segs:
                if src == BASE_SRC and a <= e < b:
                    out.append((BASE_SRC, e, e + 1))
            return out
        if kind != K_EVENT or e >= self.n_events:
            return []
        lo, hi = self.event_block(e)
        every, r = self.ORPHAN_EVERY, self._orphan_r
        for src, a, b in segs:
            if src == BASE_SRC:
                a, b = max(a, lo), min(b, hi)
                o = a + (r - a) % every
                while a < b:
                    stop = min(o, b)
                    if stop > a:
                        out.append((BASE_SRC, a, stop))
                    a = stop + 1
                    o += every
            else:
                for i in range(a, b):
                    if self.tx_event_index(INS_SRC, i) == e:
                        out.append((INS_SRC, i, i + 1))
        return out

    def render_transaction(self, src: int, idx: int) -> str:
        ids = self.codec
        if src == BASE_SRC:
            d = self.rng.bytes(K_TX, idx)
            tid = ids.make(K_TX, idx)
            e = idx * self.n_events // self.n_tx
            version = 0
            if idx % self.ORPHAN_EVERY == self._orphan_r:
                eid = ids.make(K_PHANTOM_EVENT, idx)
            else:
                eid = self.event_id(e)
                version = self.event_version.get(e, 0) if self.event_version else 0
            fkind = K_FILE
        else:
            d = self.rng.bytes(K_TX_INS, idx)
            tid = ids.make(K_TX_INS, idx)
            e = self.tx_event.get(idx, -1) if self.tx_event else -1
            if e < 0:
                e = int.from_bytes(d[56:60], "big") % self.n_events
            eid = self.event_id(e) if e < self.n_events else self._ins_event_id(e)
            version = 0
            fkind = K_FILE_INS
        if edits := self.tx_edits.get((src, idx)):
            d = bytes([(d[0] + edits) & 255]) + d[1:]  # the product: d[0] & 15
        if version and (idx + version) % 2 == 0:
            # An evolved event's transactions change: every other one gets another qty and is
            # exported.
            d = d[:1] + bytes([(d[1] + 37 * version) & 255]) + d[2:10] + b"\x00" + d[11:]
        start, dur_h = self.event_timing(e)
        pid, price, proxy = self._products[d[0] & 15]
        sale = start + (((d[2] << 8) | d[3]) * dur_h * HOUR_MS >> 16)
        created = sale + (d[4] << 10) + d[5]
        sale_s = ts(sale)
        b6 = d[6]
        if b6 < 90:
            invoice = ',"invoice_status":"ReadyToInvoice"'
        else:
            inv = ids.make(K_INVOICE, idx * 2 + src)
            invoice = f',"invoice_status":"Invoiced","invoice_id":["{inv}"'
            if b6 > 230:
                invoice += f',"{ids.make(K_INVOICE, (idx * 2 + src) | 1 << 50)}"'
            invoice += "]"
            if b6 & 3 == 0:
                invoice += f',"prev_invoice_id":"{ids.make(K_INVOICE, (idx * 2 + src) | 1 << 51)}"'
        date = f',"date":"{sale_s[:11]}00:00:00.000Z"' if d[7] < 100 else ""
        credits = self._credits[d[8]]
        head = (
            f'{{"_id":"{tid}","price":{price},"qty":{self._qty[d[1]]},'
            f'"eventId":{self._event_id_json(eid, idx)},'
            f'"productId":"{pid}"{proxy if d[9] < 200 else ""},"saleTime":"{sale_s}",'
            f'"created":"{ts(created)}"{date}{invoice},"credits":{credits},'
            f'"item_credit_state":{"false" if credits == "0" else "true"},'
            f'"exportDetails":{{"processed":{"true" if d[10] < 150 else "false"}}}'
        )
        b11 = d[11]
        if b11 < 38:  # ~15% without a custom report
            return head + "}"
        cfg = self.configs[b11 & 3]
        with_id = b11 & 4
        # Up to 64 fields (Shape.report_fields): the 52 bytes after d[11], then the first 12 again.
        vals = [
            pool[b] for pool, b in zip(cfg.entries[with_id >> 2], d[12:] + d[:12], strict=False)
        ]
        for k, pre, suf, suf_id in cfg.uploads:
            if vals[k]:
                fid = ids.make(fkind, idx * self._file_stride + k)
                vals[k] = f',{pre}"{fid}"{suf_id if with_id else suf}'
        tail = cfg.tail_nested if b11 & 8 else cfg.tail_flat
        return f'{head},"_customReport":{{"reportResults":{{{"".join(vals)[1:]}{tail}'

    # ---- events ------------------------------------------------------------------------------

    def _event_id(self, e: int) -> str:
        if self.numeric_event_ids:
            return str(self.NUMERIC_EVENT_ID_BASE + e)
        return self.codec.make(K_EVENT, e)

    def _ins_event_id(self, e: int) -> str:
        if self.numeric_event_ids:
            return str(self.NUMERIC_EVENT_ID_BASE + e)
        return self.codec.make(K_EVENT_INS, e - self.n_events)

    def _parse_event_id(self, text: str) -> tuple[int, int] | None:
        """``(kind, index)`` of a numeric event id (``numeric_event_ids``); None otherwise."""
        if not (self.numeric_event_ids and text.isascii() and text.isdigit()):
            return None
        e = int(text) - self.NUMERIC_EVENT_ID_BASE
        if e < 0:
            return None
        return (K_EVENT, e) if e < self.n_events else (K_EVENT_INS, e - self.n_events)

    def _event_id_json(self, eid: str, idx: int) -> str:
        """An event id as a transaction's ``eventId``: a JSON string, or with
        ``numeric_event_ids`` a JSON number for every other transaction."""
        if self.numeric_event_ids and idx % 2 == 0 and eid.isdigit():
            return eid
        return f'"{eid}"'

    def _event_timing(self, e: int) -> tuple[int, int]:
        """(start ms of the first planned time, duration hours) of event ``e``.

        ``e >= n_events`` is inserted event ``e - n_events`` (as ``event_obj`` numbers it).
        """
        if e >= self.n_events:
            d = self.rng.bytes(K_EVENT_INS, e - self.n_events)
            return (NOW_DAY + 5 + d[3] % 60) * DAY_MS + (8 + d[0] % 4) * HOUR_MS, 7
        d = self.rng.bytes(K_EVENT, e)
        day = FIRST_DAY + e * SPAN_DAYS // self.n_events
        start = day * DAY_MS + (8 + d[0] % 4) * HOUR_MS + (d[1] % 4) * 15 * 60_000
        return start, (6, 7, 7, 7, 8)[d[2] % 5]

    def group_of_event(self, e: int) -> int:
        return e * self.n_groups // self.n_events

    def project_of_group(self, g: int) -> int:
        return self.rng.bytes(K_GROUP, g)[0] % len(PROJECTS)

    def project_obj(self, p: int) -> dict:
        name, _ = PROJECTS[p]
        return {
            "_id": self.codec.make(K_PROJECT, p),
            "name": name,
            "eventSettings": {
                "isCRMLeads": p % 2 == 1,
                "enableMessenger": True,
                "useTargets": p != 2,
            },
            "viewConfig": {
                "user": {"visibleToClient": p % 2 == 0},
                "location": {"visibleToClient": True},
                "project": {"visibleToClient": p != 3},
            },
            "client": "Demo Beverages GmbH",
        }

    def user_obj(self, u: int) -> dict:
        d = self.rng.bytes(K_USER, u)
        first = FIRST_NAMES[d[0] % len(FIRST_NAMES)]
        last = LAST_NAMES[d[1] % len(LAST_NAMES)]
        mail_last = last.lower().replace("ü", "ue").replace("ö", "oe").replace("ä", "ae")
        mail_first = first.lower().replace("é", "e").replace("ü", "ue")
        return {
            "_id": self.codec.make(K_USER, u),
            "firstName": first,
            "lastName": last,
            "email": f"{mail_first}.{mail_last}{u}@promo-agentur.example",
            "language": LANGUAGES[d[2] % len(LANGUAGES)],
            "usertype": "agency",
        }

    def pos_obj(self, p: int, e: int, ed: bytes) -> dict:
        """Point of sale ``p`` as embedded in event ``e``: some fields vary between events."""
        d = self.rng.bytes(K_POS, p)
        city, postal, lat, lng, districts = CITIES[d[0] % len(CITIES)]
        chain = CHAINS[d[1] % len(CHAINS)]
        district = districts[d[2] % len(districts)]
        variant = (ed[20] + e) % 3
        name = (
            f"{chain} {city}-{district}",
            f"{chain} Markt {district}",
            f"{chain.title()} {district} ({city})",
        )[variant]
        street = f"{STREETS[d[3] % len(STREETS)]} {1 + d[4] % 120}"
        plz = f"{postal}{(d[5] * 131 + d[6]) % 1000:03d}"
        phone = f"+49 {30 + d[7] % 60} {100000 + d[8] * 3001 % 900000}"
        lat_p = round(lat + (d[9] - 128) / 2000, 6)
        lng_p = round(lng + (d[10] - 128) / 1400, 6)
        website = f"https://www.{chain.lower()}.example/markt/{p}"
        groups = [
            {
                "_id": self.codec.make(K_LOCGROUP, g),
                "name": LOCATION_GROUP_NAMES[g],
            }
            for g in sorted({d[11] % 5, d[12] % 5})
        ]
        obj: dict = {
            "_id": self.codec.make(K_POS, p),
            "name": name,
            "number": "" if d[13] < 40 else f"{1000 + p}",
            "address": {
                "company": f"{chain} {'GmbH' if d[14] % 2 else 'Markt KG'}",
                "city": city,
                "postal": plz,
                "streetnumber": street,
                "additional": ("", "Eingang Rückseite", "im Einkaufszentrum")[variant]
                if d[15] % 2
                else "",
                "phone": "" if variant == 2 else phone,
                "email": "" if d[16] < 80 else f"markt{p}@{chain.lower()}.example",
                "fax": "",
                "website": website if d[17] % 3 else "",
            },
            "locationGroups": groups,
            "location": [lng_p, lat_p],
            "genericFields": {
                "customer_number": f"K-{40000 + p}",
                "sales_region": None if d[18] % 3 == 0 else AREA_NAMES[d[18] % 8],
                "store_size_sqm": None if d[19] % 4 == 0 else 400 + d[19] * 20,
                "opening_hours": None if variant == 1 else "Mo-Sa 07:00-21:00",
            },
        }
        for k in range(self.shape.pos_extra_fields):  # a fuller object (Shape.pos_extra_fields)
            b = d[(25 + k) % 64] ^ k
            obj["genericFields"][f"attribute_{k:03d}"] = (
                f"{LOCATION_GROUP_NAMES[b % 5]}: {TEXT_WORDS[(b >> 3) % len(TEXT_WORDS)]} ({b})"
            )
        if d[20] < 150:
            obj["googleResult"] = {
                "formatted_address": f"{street}, {plz} {city}, Deutschland",
                "formatted_phone_number": phone.replace("+49 ", "0"),
                "international_phone_number": phone,
                "place_id": "ChIJ" + self.codec.make(K_PLACE, p)[:23],
                "website": website,
                "rating": round(3 + d[21] / 128, 1),
                "user_ratings_total": d[22] * 7,
                "geometry": {
                    "location": {
                        "lat": round(lat_p + (d[23] - 128) / 100000, 7),
                        "lng": round(lng_p + (d[24] - 128) / 100000, 7),
                    }
                },
            }
        return obj

    def area_obj(self, project: int, a: int) -> dict:
        d = self.rng.bytes(K_AREA, project * 8 + a)
        return {
            "_id": self.codec.make(K_AREA, project * 8 + a),
            "name": f"{AREA_NAMES[a]} {PROJECTS[project][1]}",
            "number": f"A-{project + 1}{a + 1:02d}",
            "channel": [self.codec.make(K_CHANNEL, c) for c in sorted({d[0] % 3, d[1] % 3})],
            "relatedUsers": [self.codec.make(K_USER, d[2 + k] % self._n_users) for k in range(2)],
            "active": a != 7,
            "created": ts((5 + project * 10) * DAY_MS + 8 * HOUR_MS + a * 600_000),
        }

    def event_obj(self, src: int, idx: int) -> dict:
        if src == BASE_SRC:
            e = idx
            d = self.rng.bytes(K_EVENT, e)
            eid = self.event_id(e)
            start, dur_h = self.event_timing(e)
            project = self.project_of_group(self.group_of_event(e))
        else:
            e = self.n_events + idx  # a virtual index for the per-event sub-ids
            d = self.rng.bytes(K_EVENT_INS, idx)
            eid = self._ins_event_id(e)
            day = NOW_DAY + 5 + d[3] % 60
            start = day * DAY_MS + (8 + d[0] % 4) * HOUR_MS
            dur_h = 7
            project = d[4] % len(PROJECTS)
        sub = e * 8
        pos = (e * 2654435761 + d[5]) % self._n_pos if src == BASE_SRC else d[6] % self._n_pos
        pos = (pos + self.event_moves.get(e, 0) * (src == BASE_SRC)) % self._n_pos
        # Planned times: 1-3 consecutive days.
        times = []
        for k in range(1 + d[7] % 3):
            t0 = start + k * DAY_MS
            times.append(
                {
                    "_id": self.codec.make(K_TIMES, sub + k),
                    "start": ts(t0),
                    "stop": ts(t0 + dur_h * HOUR_MS),
                    "duration": dur_h,
                }
            )
        # Status history: 2-5 entries (at least shape.status_history: Published/Rejected rounds
        # after the first), array order rotated so it is never time order.
        future = start // DAY_MS > NOW_DAY
        paths = STATE_PATHS_FUTURE if future else STATE_PATHS_PAST
        path = paths[d[8] % len(paths)]
        if self.shape.status_history > len(path):
            rounds = (self.shape.status_history - len(path) + 1) // 2
            path = [path[0], *(["Published", "Rejected"] * rounds), *path[1:]]
        users = [(d[9 + k] * 131 + e) % self._n_users for k in range(1 + (d[12] % 3 == 0))]
        users = [
            (u + self.event_reassigned.get(e, 0) * (src == BASE_SRC)) % self._n_users for u in users
        ]
        planner = self.codec.make(K_USER, d[13] % self._n_users)
        t = start - (20 + d[14] % 30) * DAY_MS + (d[15] % 10) * HOUR_MS
        history = []
        stamps: dict[str, list[str]] = {}
        prev = ""
        for k, state in enumerate(path):
            when = ts(t)
            user = planner if k < 2 else self.codec.make(K_USER, users[0])
            history.append(
                {
                    "_id": self.codec.make(K_HISTORY, sub + k)
                    if k < 8
                    else self.codec.make(K_HISTORY_MORE, e * 256 + k),
                    "stateNew": state,
                    "stateOld": prev,
                    "date": when,
                    "historyType": "eventState",
                    "ip": f"10.{d[16] % 200}.{d[17]}.{(d[18] + k) % 250 + 1}",
                    "user": user,
                }
            )
            stamps.setdefault(state, []).append(when)
            prev = state
            b = d[(19 + k) % 64]
            t += (1 + b % 5) * DAY_MS if k < 2 else (2 + b % 9) * HOUR_MS
        r = 1 + d[24] % (len(history) - 1)
        history = history[r:] + history[:r]
        state = path[-1]
        for k in range(self.event_version.get(e, 0) if src == BASE_SRC else 0):  # evolve()
            new = NEXT_STATE[state]
            when = ts(t + k * DAY_MS)
            history.append(
                {
                    "_id": self.codec.make(K_HISTORY_EVOLVED, e * 64 + k),
                    "stateNew": new,
                    "stateOld": state,
                    "date": when,
                    "historyType": "eventState",
                    "ip": f"10.{d[16] % 200}.{d[17]}.{(d[18] + k) % 250 + 1}",
                    "user": self.codec.make(K_USER, users[0]),
                }
            )
            stamps.setdefault(new, []).append(when)
            state = new
        area = self.area_obj(project, d[25] % 8)
        event: dict = {
            "_id": int(eid) if self.numeric_event_ids else eid,
            "project_id": self.project_obj(project),
            "point_of_sale": self.pos_obj(pos, e, d),
            "pointOfSaleProjectStructure": {"area": area},
            "times": times,
            "eventState": state,
            "eventStateHistory": [] if e * 61 % 100 < self.shape.undated_events else history,
            "eventStateTimestamps": stamps,
            "eventUser": [self.user_obj(u) for u in users],
            "agency_user": [
                {
                    "_id": self.codec.make(K_AGENCY_USER, sub + k),
                    "user_id": self.codec.make(K_USER, u),
                    "paymentType": "project",
                    "payment": {
                        "fixum": {"amount": (120, 150, 180, 95.5)[d[26 + k] % 4], "per": "event"},
                        "provision": "no",
                    },
                }
                for k, u in enumerate(users)
            ],
        }
        if self.shape.event_reports or d[30] < 100:
            project_id = event["project_id"]["_id"]
            event["customReportResult"] = self._event_report(d, eid, project_id, sub, start)
        return event

    def _event_report(
        self, d: bytes, eid: str, project_id: str, sub: int, start: int
    ) -> list[dict]:
        out = []
        for k in range(self.shape.event_reports or 1 + (d[31] < 40)):
            cfg = self.configs[(d[32] + k) % len(self.configs)]
            results: dict = {}
            for j, f in enumerate(cfg.fields):
                # Reports after the second draw their values from other bytes.
                v = f.pool[d[(33 + j + 7 * (k // 2)) % 64]]
                if v is None:
                    continue
                if v is not FILE:
                    value = json.loads(v)
                elif j < 8:
                    value = self.codec.make(K_FILE, (1 << 50) | (sub + j))
                else:
                    value = self.codec.make(K_FILE_EVENT, (sub + k) * 64 + j)
                results[f.field_id] = {"name": f.name, "value": value}
            if d[50] < 40 and k == 0:  # a field no configuration defines
                results[self.codec.make(K_UNKNOWN_FIELD, sub)] = {
                    "name": "Altes Feld",
                    "value": "n/a",
                }
            out.append(
                {
                    "_id": self.codec.make(K_CRR, sub + k),
                    "_event": int(eid) if self.numeric_event_ids else eid,
                    "_project": project_id,
                    "created": ts(start + (k + 1) * 9 * HOUR_MS),
                    "reportResults": results,
                }
            )
        return out

    def render_event(self, src: int, idx: int) -> str:
        return wire(_dumps(self.event_obj(src, idx)))

    # ---- event groups ------------------------------------------------------------------------

    def group_events(self, g: int) -> range:
        """Base event indices of base group ``g``."""
        n, m = self.n_events, self.n_groups
        return range((g * n + m - 1) // m, ((g + 1) * n + m - 1) // m)

    def group_obj(self, src: int, idx: int) -> dict:
        if src == BASE_SRC:
            d = self.rng.bytes(K_GROUP, idx)
            gid = self.codec.make(K_GROUP, idx)
            project = d[0] % len(PROJECTS)
            events = [self.event_id(e) for e in self.group_events(idx)]
        else:
            d = self.rng.bytes(K_GROUP_INS, idx)
            gid = self.codec.make(K_GROUP_INS, idx)
            project = d[0] % len(PROJECTS)
            events = []
        pname, short = PROJECTS[project]
        city = CITIES[d[1] % len(CITIES)][0]
        return {
            "_id": gid,
            "name": f"{short} KW {1 + d[2] % 52} {city}",
            "project_name": pname,
            "events": events,
            "created": ts((FIRST_DAY - 30 + d[3] % SPAN_DAYS) * DAY_MS + d[4] * 60_000),
        }

    def group_segments(self, project_name: str | None) -> list[tuple[int, int, int]]:
        """Segments of the event-group list whose ``project_name`` equals the filter."""
        segs = self.views["event_groups"].segments
        if project_name is None:
            return segs
        out = []
        for src, a, b in segs:
            for i in range(a, b):
                if self.group_project_name(src, i) == project_name:
                    out.append((src, i, i + 1))
        return out

    def render_group(self, src: int, idx: int) -> str:
        return wire(_dumps(self.group_obj(src, idx)))

    def group_project_name(self, src: int, idx: int) -> str:
        kind = K_GROUP if src == BASE_SRC else K_GROUP_INS
        return PROJECTS[self.rng.bytes(kind, idx)[0] % len(PROJECTS)][0]
