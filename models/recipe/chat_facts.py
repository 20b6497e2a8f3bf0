"""The facts the chat corpus asks about, read from data this machine ships (no download), and the
small hand-written tables where nothing ships.

Read from the machine (the recipe fails naming the file when one is missing):
- /usr/share/zoneinfo/zone1970.tab: cities (the last part of each zone name) and each country's
  time zone (the tz database);
- /usr/share/iso-codes/json/iso_3166-1.json: country names; iso_4217.json: currencies (a currency
  whose code starts with a country's two letters is that country's, as ISO 4217 codes are formed);
- the Python standard library's docstrings (questions about functions).

Hand-written here, because nothing on the machine ships them: capitals and main languages of a
hundred countries, people's first names, shops and everyday questions (chat_corpus.py).
"""

from __future__ import annotations

import importlib
import inspect
import json
import zlib
from pathlib import Path

ZONE_TAB = Path("/usr/share/zoneinfo/zone1970.tab")
ISO_DIR = Path("/usr/share/iso-codes/json")


def _need(path: Path) -> Path:
    if not path.is_file():
        raise SystemExit(
            f"the chat corpus reads {path}, which is missing: install the Debian packages tzdata and "
            "iso-codes (they ship it), then run the recipe again"
        )
    return path


def held_out(key: str, share: int) -> bool:
    """Whether `key` is in the held-out split (`share` percent of keys, by a stable hash): the same
    on every machine and run, so training never sees a held-out entity."""
    return zlib.crc32(key.encode()) % 100 < share


def country_names() -> dict[str, str]:
    rows = json.loads(_need(ISO_DIR / "iso_3166-1.json").read_text())["3166-1"]
    return {r["alpha_2"]: r.get("common_name", r["name"]) for r in rows}


def zones() -> list[tuple[list[str], str]]:
    """(country codes, zone) rows of the tz database's zone1970.tab."""
    out = []
    for line in _need(ZONE_TAB).read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        codes, _coords, zone = line.split("\t")[:3]
        out.append((codes.split(","), zone))
    return out


def cities() -> list[str]:
    """City names from the tz database's zones (Europe/Paris -> Paris), each once, in a fixed order."""
    seen: dict[str, None] = {}
    for _codes, zone in zones():
        city = zone.rsplit("/", 1)[-1].replace("_", " ")
        if city.isascii() and "GMT" not in city and len(city) > 2:
            seen.setdefault(city, None)
    return list(seen)


def country_zones() -> dict[str, str]:
    """Country name -> its time zone, for countries the tz database gives exactly one zone."""
    names = country_names()
    per: dict[str, list[str]] = {}
    for codes, zone in zones():
        for code in codes:
            per.setdefault(code, []).append(zone)
    return {names[c]: z[0] for c, z in per.items() if len(z) == 1 and c in names}


def currencies() -> dict[str, tuple[str, str]]:
    """Country name -> (currency name, ISO 4217 code)."""
    names = country_names()
    rows = json.loads(_need(ISO_DIR / "iso_4217.json").read_text())["4217"]
    out: dict[str, tuple[str, str]] = {}
    for r in rows:
        code = r["alpha_3"]
        if code[:2] in names and not code.startswith("X"):
            out.setdefault(names[code[:2]], (r["name"], code))
    return out


# Hand-written: nothing on the machine maps countries to capitals or languages.
CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Portugal": "Lisbon",
    "United Kingdom": "London", "Ireland": "Dublin", "Netherlands": "Amsterdam", "Belgium": "Brussels",
    "Switzerland": "Bern", "Austria": "Vienna", "Poland": "Warsaw", "Czechia": "Prague",
    "Hungary": "Budapest", "Greece": "Athens", "Sweden": "Stockholm", "Norway": "Oslo",
    "Denmark": "Copenhagen", "Finland": "Helsinki", "Iceland": "Reykjavik", "Russia": "Moscow",
    "Ukraine": "Kyiv", "Romania": "Bucharest", "Bulgaria": "Sofia", "Serbia": "Belgrade",
    "Croatia": "Zagreb", "Slovenia": "Ljubljana", "Slovakia": "Bratislava", "Estonia": "Tallinn",
    "Latvia": "Riga", "Lithuania": "Vilnius", "Turkey": "Ankara", "Egypt": "Cairo", "Morocco": "Rabat",
    "Algeria": "Algiers", "Tunisia": "Tunis", "Nigeria": "Abuja", "Kenya": "Nairobi",
    "Ethiopia": "Addis Ababa", "Ghana": "Accra", "Senegal": "Dakar", "South Africa": "Pretoria",
    "Tanzania": "Dodoma", "Uganda": "Kampala", "Angola": "Luanda", "Zambia": "Lusaka",
    "Zimbabwe": "Harare", "Mozambique": "Maputo", "Madagascar": "Antananarivo", "Sudan": "Khartoum",
    "Saudi Arabia": "Riyadh", "Iran": "Tehran", "Iraq": "Baghdad", "Israel": "Jerusalem",
    "Jordan": "Amman", "Lebanon": "Beirut", "Syria": "Damascus", "Qatar": "Doha",
    "United Arab Emirates": "Abu Dhabi", "Oman": "Muscat", "Kuwait": "Kuwait City", "India": "New Delhi",
    "Pakistan": "Islamabad", "Bangladesh": "Dhaka", "Nepal": "Kathmandu", "Sri Lanka": "Colombo",
    "China": "Beijing", "Japan": "Tokyo", "South Korea": "Seoul", "North Korea": "Pyongyang",
    "Mongolia": "Ulaanbaatar", "Vietnam": "Hanoi", "Thailand": "Bangkok", "Cambodia": "Phnom Penh",
    "Laos": "Vientiane", "Myanmar": "Naypyidaw", "Malaysia": "Kuala Lumpur", "Singapore": "Singapore",
    "Indonesia": "Jakarta", "Philippines": "Manila", "Australia": "Canberra",
    "New Zealand": "Wellington", "Canada": "Ottawa", "United States": "Washington, D.C.",
    "Mexico": "Mexico City", "Guatemala": "Guatemala City", "Cuba": "Havana", "Jamaica": "Kingston",
    "Colombia": "Bogota", "Venezuela": "Caracas", "Ecuador": "Quito", "Peru": "Lima",
    "Bolivia": "Sucre", "Chile": "Santiago", "Argentina": "Buenos Aires", "Uruguay": "Montevideo",
    "Paraguay": "Asuncion", "Brazil": "Brasilia", "Kazakhstan": "Astana", "Uzbekistan": "Tashkent",
    "Afghanistan": "Kabul", "Georgia": "Tbilisi", "Armenia": "Yerevan", "Azerbaijan": "Baku",
}  # fmt: skip
LANGUAGES = {
    "France": "French", "Germany": "German", "Italy": "Italian", "Spain": "Spanish",
    "Portugal": "Portuguese", "Netherlands": "Dutch", "Poland": "Polish", "Greece": "Greek",
    "Sweden": "Swedish", "Norway": "Norwegian", "Denmark": "Danish", "Finland": "Finnish",
    "Russia": "Russian", "Ukraine": "Ukrainian", "Turkey": "Turkish", "Egypt": "Arabic",
    "Saudi Arabia": "Arabic", "Iran": "Persian", "Israel": "Hebrew", "India": "Hindi",
    "China": "Mandarin Chinese", "Japan": "Japanese", "South Korea": "Korean", "Vietnam": "Vietnamese",
    "Thailand": "Thai", "Indonesia": "Indonesian", "Brazil": "Portuguese", "Mexico": "Spanish",
    "Argentina": "Spanish", "Hungary": "Hungarian", "Czechia": "Czech", "Romania": "Romanian",
    "Kenya": "Swahili", "Ethiopia": "Amharic", "Pakistan": "Urdu", "Bangladesh": "Bengali",
}  # fmt: skip

FIRST_NAMES = (
    "Alice Bruno Chloe Daniel Emma Farid Grace Hiro Ines Jonas Kira Liam Maya Noah Olga Pavel Quinn "
    "Rosa Sami Tara Umar Vera Wen Xavier Yuki Zoe Amara Boris Carmen Dmitri Elena Felix Greta Hana "
    "Ivan Julia Kofi Lena Mateo Nadia Oscar Priya Rafael Sofia Tomas Ulla Victor Wanda Yara Zane Aiko "
    "Ben Clara Diego Eva Fatima Gustav Helga Isaac Jana Karim Lucia Marco Nina Omar Paula Ruben Sara"
).split()
DOCSTRING_MODULES = (
    "os", "os.path", "shutil", "json", "math", "random", "string", "textwrap", "statistics", "heapq",
    "bisect", "glob", "fnmatch", "base64", "hashlib", "zlib", "gzip", "csv", "calendar", "time",
    "datetime", "copy", "pprint", "difflib", "html", "urllib.parse", "ipaddress", "uuid", "secrets",
    "operator", "functools", "itertools", "collections", "tempfile", "pathlib", "re", "struct",
)  # fmt: skip


def docstrings() -> dict[str, str]:
    """`module.function` -> the first sentence of its docstring, for public functions whose first
    line is a plain sentence of 4 to 24 words."""
    out: dict[str, str] = {}
    for name in DOCSTRING_MODULES:
        module = importlib.import_module(name)
        for attr in sorted(vars(module)):
            obj = getattr(module, attr)
            if attr.startswith("_") or not callable(obj) or inspect.isclass(obj):
                continue
            first = (inspect.getdoc(obj) or "").strip().split("\n\n")[0].replace("\n", " ")
            sentence = first.split(". ")[0].rstrip(".")
            words = sentence.split()
            if not 4 <= len(words) <= 24 or ">>>" in sentence or "(" in words[0]:
                continue
            if sentence[0].isupper():
                out.setdefault(f"{name}.{attr}", sentence + ".")
    return out
