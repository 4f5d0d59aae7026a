"""The demo's training text: plain sentences and chat question/answer pairs generated from templates.

Four domains (general, legal, medical, code), each with its own vocabulary and style. Some lines start with
domain-neutral openers ("In short, ...") and some chats ask domain-neutral questions ("Tell me something
useful."): the base model, trained on all domains, has to guess a domain there, while an adapter trained on
one domain answers in it. That is what makes the adapters visibly change outputs. Pure Python and seeded:
the same `seed` always gives the same lines.
"""

from __future__ import annotations

import random
import re

DOMAINS = ("general", "legal", "medical", "code")

SLOTS: dict[str, list[str]] = {
    # general
    "animal": ["cat", "dog", "horse", "rabbit", "small bird", "old goat"],
    "place": ["park", "market", "river", "library", "station", "beach", "garden", "village square"],
    "thing": ["clouds", "boats", "people", "trees", "trains", "stars"],
    "day": ["Monday", "Tuesday", "Friday", "Saturday", "Sunday"],
    "food": ["fresh bread", "apples", "cheese", "warm soup", "fish", "tomatoes"],
    "hobby": ["read a book", "go for a walk", "paint", "bake a cake", "ride a bike", "play music"],
    "weather": ["sunny", "rainy", "cold", "windy", "warm", "cloudy"],
    "adj": ["quiet", "busy", "bright", "calm", "pleasant", "long"],
    "room": ["kitchen", "living room", "garden", "attic"],
    "game": ["chess", "cards", "football", "hide and seek"],
    "topic": ["old ships", "mountains", "the sea", "birds", "history", "gardens"],
    "city": ["Paris", "Berlin", "Lisbon", "Oslo", "Rome", "Vienna"],
    "drink": ["tea", "coffee", "hot chocolate", "lemonade"],
    # legal
    "party": ["tenant", "landlord", "buyer", "seller", "employer", "employee", "licensee", "contractor"],
    "party2": ["company", "owner", "lender", "client", "licensor", "supplier"],
    "duty": [
        "pay the rent on time",
        "deliver the goods",
        "give written notice",
        "keep the premises in good repair",
        "protect confidential information",
        "insure the property",
    ],
    "doc": ["agreement", "contract", "lease", "licence", "deed"],
    "state": ["New York", "California", "Delaware", "Texas", "Ohio"],
    "cause": ["any breach of this agreement", "negligence", "a defect in the goods", "late delivery"],
    "remedy": ["damages", "specific performance", "an injunction", "a refund of the deposit"],
    # medical
    "symptom": ["a mild fever", "a dry cough", "a headache", "chest pain", "fatigue", "a sore throat", "nausea"],
    "drug": ["ibuprofen", "paracetamol", "amoxicillin", "aspirin", "metformin", "salbutamol"],
    "dose": ["200 mg", "500 mg", "10 mg", "1 g"],
    "condition": ["influenza", "asthma", "hypertension", "a chest infection", "diabetes", "migraine"],
    "test": ["blood test", "chest x-ray", "heart scan", "urine test", "brain scan"],
    "finding": ["infection", "fracture", "inflammation", "bleeding"],
    "vital": ["blood pressure", "temperature", "heart rate", "oxygen level"],
    # code
    "fname": ["parse_args", "load_config", "sort_items", "read_file", "count_words", "merge_lists"],
    "ptype": ["list", "dict", "string", "tuple", "set"],
    "var": ["items", "result", "config", "path", "counts", "buffer"],
    "task": ["sort a list", "read a file", "count words", "reverse a string", "merge two dicts", "remove duplicates"],
    "err": ["KeyError", "ValueError", "TypeError", "IndexError"],
    "tool": ["pytest", "git", "pip", "black"],
}

PLAIN: dict[str, list[str]] = {
    "general": [
        "The {animal} sat by the {place} and watched the {thing}.",
        "On {day} morning we walked to the {place} and bought {food}.",
        "My friend likes to {hobby} when the weather is {weather}.",
        "The {weather} weather made the {place} feel {adj}.",
        "After dinner the family played {game} in the {room}.",
        "She read a book about {topic} on the train to {city}.",
        "It was a {adj} day, so we stayed in the {room} and drank {drink}.",
        "The weather today is {weather}, so it is a good day to {hobby}.",
        "Every {day} the {animal} waits at the door of the {room}.",
        "We took the train to {city} and spent the afternoon at the {place}.",
        "The {place} was {adj} and the {thing} moved slowly in the wind.",
        "He made {food} for lunch and then decided to {hobby}.",
    ],
    "legal": [
        "The {party} shall {duty} under this {doc}.",
        "This {doc} is governed by the laws of the State of {state}.",
        "The court held that the {party} breached the {doc} by failing to {duty}.",
        "Either party may terminate this {doc} with {n} days written notice.",
        "The {party} agrees to indemnify the {party2} against all claims arising from {cause}.",
        "Under section {n} of the {doc}, the {party} must {duty}.",
        "The judge dismissed the claim because the {party} did not {duty}.",
        "Any dispute under this {doc} shall be resolved by arbitration in {state}.",
        "If the {party} fails to {duty}, the {party2} may seek {remedy}.",
        "The {party} shall pay the {party2} within {n} days of the invoice date.",
        "Nothing in this {doc} limits the right of the {party2} to seek {remedy}.",
        "The contract requires the {party} to {duty} and to notify the {party2} of {cause}.",
    ],
    "medical": [
        "The patient presented with {symptom} and {symptom2} for {n} days.",
        "The doctor prescribed {drug} {dose} twice daily for {condition}.",
        "The nurse checked the {vital} and recorded it in the chart.",
        "Treatment for {condition} includes rest, fluids and {drug}.",
        "A follow-up visit is recommended in {n} weeks to review the {test} results.",
        "The {test} showed no signs of {finding}.",
        "The patient with {condition} reported {symptom} after taking {drug}.",
        "The doctor said that {symptom} is common with {condition} and usually improves in {n} days.",
        "Her {vital} was normal and the {test} was clear.",
        "Patients with {condition} should avoid {drug} unless the doctor advises it.",
        "The clinic ordered a {test} to rule out {finding}.",
        "The patient was discharged with {drug} {dose} and advice to rest.",
    ],
    "code": [
        "The function {fname} returns a {ptype} of {var}.",
        "def {fname}({var}):\n    return sorted({var})",
        "To fix the bug, check that {var} is not None before calling {fname}.",
        "The loop iterates over each item in {var} and appends it to result.",
        "Run {tool} before you merge the branch.",
        "If the key is missing, {fname} raises a {err}.",
        "for item in {var}:\n    print(item)",
        "The test calls {fname} with an empty {ptype} and expects a {err}.",
        "Use a {ptype} when you need to store {var} by key.",
        "import json\n{var} = json.loads(text)",
        "The code reads {var} from the file and passes it to {fname}.",
        "Refactor {fname} so that it accepts a {ptype} instead of a string.",
    ],
}

# (question, answer) pairs for the chat form; the answer shares slots with the question.
CHAT: dict[str, list[tuple[str, str]]] = {
    "general": [
        ("What should I do on a {weather} day?", "On a {weather} day you can {hobby} or visit the {place}."),
        ("Where can I buy {food}?", "You can buy {food} at the {place} on {day} morning."),
        ("Tell me about {city}.", "{city} is a {adj} city with a beautiful {place} and many {thing}."),
        ("What is a good game for the family?", "The family can play {game} in the {room} after dinner."),
    ],
    "legal": [
        (
            "Can the {party} end the {doc} early?",
            "Yes, the {party} may terminate the {doc} with {n} days written notice, as stated in section {m}.",
        ),
        (
            "What happens if the {party} does not {duty}?",
            "If the {party} does not {duty}, the {party2} may seek {remedy} for breach of the {doc}.",
        ),
        ("Which law governs the {doc}?", "The {doc} is governed by the laws of the State of {state}."),
        (
            "Who pays if there is {cause}?",
            "The {party} must indemnify the {party2} against all claims arising from {cause}.",
        ),
    ],
    "medical": [
        (
            "What helps with {symptom}?",
            "For {symptom}, rest and drink fluids; the doctor may prescribe {drug} {dose} "
            "if it lasts more than {n} days.",
        ),
        (
            "What is the treatment for {condition}?",
            "Treatment for {condition} includes rest, fluids and {drug} {dose}.",
        ),
        ("Why did the doctor order a {test}?", "The doctor ordered a {test} to rule out {finding}."),
        (
            "Is {symptom} serious?",
            "{Symptom} is usually not serious, but see a doctor if it lasts more than {n} days or comes with {symptom2}.",
        ),
    ],
    "code": [
        ("How do I {task} in Python?", "Write a function {fname} that takes a {ptype} and returns the result."),
        ("Why do I get a {err}?", "A {err} means {var} has the wrong value; check it before you call {fname}."),
        ("How do I run the tests?", "Run {tool} in the project folder before you merge the branch."),
        ("What does {fname} return?", "The function {fname} returns a {ptype} of {var}."),
    ],
}

# Domain-neutral openers and questions shared by every domain (answered with a sentence of the domain).
OPENERS = ["In short, ", "Here is one example: ", "Today I learned that ", "Remember that "]
QUESTIONS = ["Tell me something useful.", "Give me an example.", "What did you learn today?", "Say something."]
GENERIC_SHARE = 0.3  # fraction of lines / chats that use an opener / a neutral question

_SLOT = re.compile(r"\{(\w+)\}")


def fill(template: str, rng: random.Random, bound: dict[str, str] | None = None) -> str:
    """Fill `{slot}` fields; a slot used twice gets one value; `{Slot}` is the capitalised value."""
    bound = {} if bound is None else bound

    def value(m: re.Match) -> str:
        name = m.group(1)
        key = name.lower()
        if key not in bound:
            if key in ("n", "m"):
                bound[key] = str(rng.choice([3, 5, 7, 10, 14, 30]))
            elif key in ("symptom2",):
                bound[key] = rng.choice([s for s in SLOTS["symptom"] if s != bound.get("symptom")])
            else:
                bound[key] = rng.choice(SLOTS[key])
        v = bound[key]
        return v[0].upper() + v[1:] if name[0].isupper() else v

    return _SLOT.sub(value, template)


def _sentence(domain: str, rng: random.Random) -> str:
    # a one-line sentence of the domain (code snippets excluded), to follow an opener or answer a neutral question
    return fill(rng.choice([t for t in PLAIN[domain] if "\n" not in t]), rng)


def plain_lines(domain: str, n: int, seed: int) -> list[str]:
    """`n` plain lines of `domain`, some behind a neutral opener (seeded, deterministic)."""
    rng = random.Random(f"plain/{domain}/{seed}")
    out = []
    for _ in range(n):
        if rng.random() < GENERIC_SHARE:
            s = _sentence(domain, rng)
            out.append(rng.choice(OPENERS) + s[0].lower() + s[1:])
        else:
            out.append(fill(rng.choice(PLAIN[domain]), rng))
    return out


def chat_pairs(domain: str, n: int, seed: int) -> list[tuple[str, str]]:
    """`n` (question, answer) pairs of `domain`, some with a neutral question (seeded, deterministic)."""
    rng = random.Random(f"chat/{domain}/{seed}")
    out = []
    for _ in range(n):
        if rng.random() < GENERIC_SHARE:
            out.append((rng.choice(QUESTIONS), _sentence(domain, rng)))
            continue
        q, a = rng.choice(CHAT[domain])
        bound: dict[str, str] = {}
        out.append((fill(q, rng, bound), fill(a, rng, bound)))
    return out
