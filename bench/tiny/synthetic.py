"""Seeded synthetic documents full of numbers: reports (numbered sections, dates, amounts, codes) and tables.

They give the corpus the number-dense text that the held-out selection studies found the model distracted by
(section headings, dates and amounts around the needle); the needle is inserted later
(``bench.tiny.corpus_tasks``), so a number near it is as likely as anywhere else.
"""

from __future__ import annotations

import random

DOCS = {"reports": 3000, "tables": 1500}  # documents per synthetic source (~1 KB-3 KB each)

_TOPICS = [
    "budget",
    "inventory",
    "maintenance",
    "shipping",
    "audit",
    "staffing",
    "procurement",
    "safety",
    "energy use",
    "customer support",
    "facilities",
    "training",
    "travel",
    "licensing",
    "water supply",
]
_VERBS = ["rose", "fell", "was revised", "was approved", "was deferred", "closed", "reopened", "was reconciled"]
_NOUNS = [
    "the invoice",
    "the order",
    "the claim",
    "the shipment",
    "the contract",
    "the ticket",
    "the permit",
    "the account",
    "the request",
    "the payment",
    "the unit",
    "the batch",
]
_PLACES = ["Oslo", "Lyon", "Porto", "Leeds", "Austin", "Turin", "Ghent", "Perth", "Quito", "Osaka", "Cork"]
_MONTHS = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
]


def date(rng: random.Random) -> str:
    """A date in one of five common formats."""
    y, m, d = rng.randint(1990, 2035), rng.randint(1, 12), rng.randint(1, 28)
    return rng.choice(
        [
            f"{y}-{m:02d}-{d:02d}",
            f"{d:02d}/{m:02d}/{y}",
            f"{_MONTHS[m - 1]} {d}, {y}",
            f"{d} {_MONTHS[m - 1][:3]} {y}",
            f"{m}/{d}/{y % 100:02d}",
        ]
    )


def amount(rng: random.Random) -> str:
    """A money amount, a percentage or a quantity with a unit."""
    v = rng.choice([rng.randint(1, 999), rng.randint(1000, 99999), rng.randint(100000, 9999999)])
    return rng.choice(
        [
            f"${v:,}.{rng.randint(0, 99):02d}",
            f"EUR {v:,}",
            f"{v % 1000 / 10:.1f}%",
            f"{v} units",
            f"{v:,} kg",
            f"{v / 100:.2f} hours",
        ]
    )


def code(rng: random.Random) -> str:
    """An identifier: letters, digits and dashes (invoice numbers, part numbers, ticket ids)."""
    letters = "".join(rng.choice("ABCDEFGHJKLMNPQRSTUVWXYZ") for _ in range(rng.randint(2, 4)))
    return rng.choice(
        [
            f"{letters}-{rng.randint(100, 99999)}",
            f"{letters}{rng.randint(10, 9999)}-{rng.randint(1, 99)}",
            f"#{rng.randint(1000, 999999)}",
            f"{rng.randint(10, 99)}-{rng.randint(1000, 9999)}-{letters}",
        ]
    )


def _sentence(rng: random.Random) -> str:
    return rng.choice(
        [
            f"On {date(rng)}, {rng.choice(_NOUNS)} {code(rng)} {rng.choice(_VERBS)} at {amount(rng)}.",
            f"The {rng.choice(_TOPICS)} figure for {rng.choice(_PLACES)} {rng.choice(_VERBS)} to {amount(rng)}.",
            f"See section {rng.randint(1, 12)}.{rng.randint(1, 9)} for {rng.choice(_NOUNS)} {code(rng)}.",
            f"{rng.choice(_NOUNS).capitalize()} dated {date(rng)} totals {amount(rng)} ({code(rng)}).",
            f"Between {date(rng)} and {date(rng)}, {rng.randint(2, 400)} items {rng.choice(_VERBS)}.",
            f"Reference {code(rng)}: {amount(rng)} due by {date(rng)}.",
        ]
    )


def report(rng: random.Random) -> str:
    """A report: a title, a date line, 3-8 numbered sections of 2-6 sentences with sub-numbered items."""
    lines = [f"{rng.choice(_TOPICS).title()} report {code(rng)}", f"Issued {date(rng)}, {rng.choice(_PLACES)}", ""]
    for s in range(1, rng.randint(4, 9)):
        lines.append(f"{s}. {rng.choice(_TOPICS).capitalize()}")
        para = " ".join(_sentence(rng) for _ in range(rng.randint(2, 6)))
        lines.append(para)
        for k in range(1, rng.randint(1, 4)):
            lines.append(f"  {s}.{k} {_sentence(rng)}")
        lines.append("")
    return "\n".join(lines)


def table(rng: random.Random) -> str:
    """A table of numbers (CSV, pipe-separated or space-aligned) with a caption line."""
    cols = ["id", "date", "amount", "qty", "rate", "code", "region"][: rng.randint(3, 7)]
    rows = []
    for _ in range(rng.randint(5, 30)):
        cell = {
            "id": str(rng.randint(1, 99999)),
            "date": date(rng),
            "amount": f"{rng.uniform(0, 1e5):.2f}",
            "qty": str(rng.randint(0, 5000)),
            "rate": f"{rng.uniform(0, 1):.4f}",
            "code": code(rng),
            "region": rng.choice(_PLACES),
        }
        rows.append([cell[c] for c in cols])
    style = rng.choice(["csv", "pipe", "aligned"])
    if style == "csv":
        body = [",".join(cols)] + [",".join(r) for r in rows]
    elif style == "pipe":
        body = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)] + ["| " + " | ".join(r) + " |" for r in rows]
    else:
        w = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(cols)]
        body = ["  ".join(c.ljust(w[i]) for i, c in enumerate(cols))]
        body += ["  ".join(x.rjust(w[i]) for i, x in enumerate(r)) for r in rows]
    return f"Table {rng.randint(1, 40)}: {rng.choice(_TOPICS)} by {cols[-1]}\n" + "\n".join(body)
