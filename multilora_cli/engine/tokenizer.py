"""`Tokenizer`: a model directory's `tokenizer.json` (HF `tokenizers`) plus its chat template (jinja2).

Behaves like transformers' fast tokenizer for what the engine needs:
- `encode(text)` uses tokenizer.json's post-processor (e.g. Llama's BOS). Like transformers 5, tokenizer_config's
  `add_bos_token` / `add_eos_token` are ignored when tokenizer.json exists (its post-processor already says).
- chat templates come from `chat_template.jinja`, else `chat_template.json`, else tokenizer_config.json's
  `chat_template`; they render in a sandboxed jinja2 environment with transformers' helpers (raise_exception,
  strftime_now, a non-escaping tojson, loop controls, `{% generation %}`), and the rendered prompt is tokenized
  WITHOUT special tokens, as `apply_chat_template(tokenize=True)` does, so a template's own BOS is not doubled.
- eos ids = config.json eos_token_id ∪ generation_config.json eos_token_id ∪ tokenizer_config's eos_token.
- `encode_request(request, max_model_len)` refuses a prompt too long to fit before encoding it (token_bound.py).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from multilora_cli.engine.generation_config import read_generation_config, read_json, token_id_list
from multilora_cli.engine.request import Request
from multilora_cli.engine.token_bound import PROMPT_TOO_LONG_HINT, UTF8_MAX, TokenBound, analyze
from multilora_cli.errors import ModelError, RequestError

SPECIAL_NAMES = ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")


def _token_text(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken dict."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        return value["content"]
    return None


def _pick_template(value, where: str) -> str | None:
    """`chat_template` is a string, or a list of {"name", "template"} of which "default" is used."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        if "default" in named:
            return named["default"]
        raise ModelError(f"{where}: chat_template has no 'default' entry (found {sorted(map(str, named))})")
    raise ModelError(f"{where}: chat_template must be a string or a list of named templates")


def compile_chat_template(source: str, where: str = "chat template"):
    """Compile a chat template in an immutable sandbox with the helpers HF templates rely on."""
    import jinja2
    from jinja2 import nodes
    from jinja2.ext import Extension, loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class GenerationTag(Extension):
        # transformers marks assistant spans with {% generation %}...{% endgeneration %}; render the body as is
        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

        def _render(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # jinja's own tojson HTML-escapes; transformers' does not
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[GenerationTag, loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    try:
        return env.from_string(source)
    except jinja2.exceptions.TemplateSyntaxError as e:
        raise ModelError(f"{where}: chat template does not compile (line {e.lineno}: {e.message})") from e


class Tokenizer:
    """Text <-> token ids for one model, with its special tokens, eos ids and chat template."""

    def __init__(
        self,
        backend,
        *,
        special_tokens: dict[str, str] | None = None,
        bos_token_id: int | None = None,
        eos_token_ids: list[int] | None = None,
        chat_template: str | None = None,
        name: str = "tokenizer",
    ):
        self.backend = backend  # tokenizers.Tokenizer
        self.special_tokens = dict(special_tokens or {})
        self.bos_token_id = bos_token_id
        self.eos_token_ids = list(dict.fromkeys(eos_token_ids or []))
        self.chat_template = chat_template
        self.name = name
        # compiled at the first chat line: a job of plain prompts never imports jinja2 (cold start, issue 36); a
        # template that does not compile fails each chat line (ModelError, an error record), not the whole run
        self._template = None
        self._bound: TokenBound | None = None  # analyzed on first use (token_bound)

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load from a HF model directory (tokenizer.json required)."""
        from tokenizers import AddedToken
        from tokenizers import Tokenizer as Backend

        d = Path(path)
        tj = d / "tokenizer.json"
        if not tj.is_file():
            raise ModelError(
                f"{d}: no tokenizer.json",
                hint="multilora needs a fast tokenizer; save one with "
                "transformers (AutoTokenizer.from_pretrained(...).save_pretrained(dir))",
            )
        try:
            backend = Backend.from_file(str(tj))
        except Exception as e:  # tokenizers raises a plain Exception on malformed files
            raise ModelError(f"{tj}: unreadable tokenizer ({e})") from e
        backend.no_truncation()
        backend.no_padding()
        tc = read_json(d / "tokenizer_config.json")
        cfg = read_json(d / "config.json")

        # special tokens declared only in tokenizer_config.json's added_tokens_decoder
        extra = []
        for tok in (tc.get("added_tokens_decoder") or {}).values():
            text = _token_text(tok)
            if text is not None and backend.token_to_id(text) is None:
                extra.append(AddedToken(text, special=bool(tok.get("special", False)), normalized=False))
        if extra:
            backend.add_tokens(extra)

        special = {n: t for n in SPECIAL_NAMES if (t := _token_text(tc.get(n))) is not None}
        bos_id = backend.token_to_id(special["bos_token"]) if "bos_token" in special else None
        if bos_id is None and isinstance(cfg.get("bos_token_id"), int):
            bos_id = cfg["bos_token_id"]

        eos = token_id_list(cfg.get("eos_token_id")) + read_generation_config(d).eos_token_ids
        if "eos_token" in special and (eid := backend.token_to_id(special["eos_token"])) is not None:
            eos.append(eid)

        template = None
        if (d / "chat_template.jinja").is_file():
            template = (d / "chat_template.jinja").read_text(encoding="utf-8")
        elif (d / "chat_template.json").is_file():
            template = _pick_template(
                read_json(d / "chat_template.json").get("chat_template"), str(d / "chat_template.json")
            )
        else:
            template = _pick_template(tc.get("chat_template"), str(d / "tokenizer_config.json"))
        return cls(
            backend, special_tokens=special, bos_token_id=bos_id, eos_token_ids=eos, chat_template=template, name=str(d)
        )

    # --- text <-> ids --------------------------------------------------------------------------------------
    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def token_bound(self) -> TokenBound:
        """How many bytes of text one token covers at most (token_bound.analyze), computed once: a pass over
        the vocabulary, ~0.1-0.3 s for 150k tokens, paid only once a prompt is long enough to ask."""
        if self._bound is None:
            self._bound = analyze(self.backend.to_str())
        return self._bound

    def check_fits(self, request: Request, text: str, max_model_len: int | None) -> None:
        """RequestError `prompt_too_long` when `text` provably has more than `max_model_len` tokens, without
        encoding it (a 5 MB prompt: ~8 s and ~2 GB). Prompts that may fit are left to the scheduler's exact
        count; so are all prompts of a tokenizer without a provable bound."""
        if max_model_len is None or len(text) * UTF8_MAX <= max_model_len:
            return  # at most max_model_len bytes: no bound can refuse it (a token covers >= 1 byte); skip analyze
        found = self.token_bound.min_tokens(text, max_model_len)
        if found is not None:
            nbytes, tokens = found
            raise RequestError(
                f"request {request.id}: prompt is too long: its {nbytes:,} bytes are at least {tokens:,} tokens "
                f"(no token covers more than {self.token_bound.max_token_bytes} bytes) but max_model_len is "
                f"{max_model_len}",
                code="prompt_too_long",
                hint=PROMPT_TOO_LONG_HINT,
            )

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def decode_batch(self, seqs: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        """`decode` of each id list, in one call (the backend decodes them in parallel)."""
        return self.backend.decode_batch(seqs, skip_special_tokens=skip_special_tokens)

    @property
    def size(self) -> int:
        """Ids the tokenizer knows (added tokens included); a model's vocabulary may be padded beyond it."""
        return self.backend.get_vocab_size(with_added_tokens=True)

    # --- chat ----------------------------------------------------------------------------------------------
    @property
    def has_chat_template(self) -> bool:
        return bool(self.chat_template)

    def _compiled_template(self):
        if self._template is None:
            self._template = compile_chat_template(self.chat_template, self.name)  # ModelError if it cannot
        return self._template

    def render_chat(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        """The prompt text the chat template makes of `messages` (RequestError if it cannot)."""
        import jinja2

        if not self.chat_template:
            raise RequestError(
                f"messages given but {self.name} has no chat template",
                code="no_chat_template",
                hint="send a plain 'prompt', or use a model with a "
                "chat_template (tokenizer_config.json or chat_template.jinja)",
            )
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise RequestError("messages must be a list of objects with a 'role' (and 'content')")
        variables = {**self.special_tokens, **kwargs}
        try:
            template = self._compiled_template()
            return template.render(messages=messages, add_generation_prompt=add_generation_prompt, **variables)
        except jinja2.exceptions.TemplateError as e:
            raise RequestError(f"the chat template rejected the messages: {e}", code="chat_template") from e

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> list[int]:
        """Render and tokenize without adding special tokens (the template places BOS itself)."""
        return self.encode(self.render_chat(messages, add_generation_prompt, **kwargs), add_special_tokens=False)

    def encode_request(self, request: Request, max_model_len: int | None = None) -> list[int]:
        """Prompt ids of a request: its prompt_token_ids, else its messages via the chat template, else its
        prompt text with special tokens. RequestError when it yields no tokens, or when its text provably
        cannot fit `max_model_len` (`check_fits`: checked on the rendered chat, before encoding)."""
        if request.prompt_token_ids is not None:
            ids = list(request.prompt_token_ids)
            bad = [t for t in ids if not isinstance(t, int) or isinstance(t, bool) or not 0 <= t < self.vocab_size]
            if bad:
                raise RequestError(f"request {request.id}: prompt token ids out of range: {bad[:5]}")
        elif request.messages is not None:
            text = self.render_chat(request.messages)
            self.check_fits(request, text, max_model_len)
            ids = self.encode(text, add_special_tokens=False)  # as apply_chat_template
        else:
            self.check_fits(request, request.prompt or "", max_model_len)
            ids = self.encode(request.prompt or "")
        if not ids:
            raise RequestError(f"request {request.id}: the prompt is empty", code="empty_prompt")
        return ids
