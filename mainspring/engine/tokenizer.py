"""Tokenizer: a `tokenizers.Tokenizer` plus the special tokens and chat template of a HF folder.

Chat templates are the model's own Jinja, rendered the way transformers renders them (sandboxed,
trim_blocks + lstrip_blocks, same helpers), so a prompt is byte-identical to what the model saw in
fine-tuning without importing transformers at runtime.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as HFTokenizer

from .errors import InvalidRequestError, ModelLoadError
from .gguf_vocab import byte_to_unicode

# Used when a model ships no template: ChatML, the format of SmolLM/Qwen and many fine-tunes.
CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' ~ message['role'] ~ '\n' ~ (message['content'] or '') ~ '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# tokenizers' encode() holds the GIL throughout (about 1-4 s per MB of text), so no other thread, an event loop
# included, runs meanwhile; encode_batch() releases it and gives the same ids. Longer texts take that path.
GIL_FREE_CHARS = 1 << 14
_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")


class _GenerationTag(Extension):
    """Accept `{% generation %}...{% endgeneration %}` (transformers' assistant-mask marker) and render its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[nodes.Node]:
        next(parser.stream)
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None, separators: Any = None,
            sort_keys: bool = False) -> str:
    # Jinja's own tojson HTML-escapes (<, >, &, '), which would change what the model sees.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=1)
def _jinja_env() -> ImmutableSandboxedEnvironment:
    # Chat templates come with downloaded models: untrusted code, hence the immutable sandbox.
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


def _token_str(value: Any) -> str | None:
    # tokenizer_config.json writes special tokens as a string or as {"content": ...}.
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _id_list(value: Any) -> list[int]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int)]
    return []


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ModelLoadError(f"{path}: unreadable JSON ({e})") from e
    return data if isinstance(data, dict) else {}


class Tokenizer:
    """Text <-> token ids, special tokens and chat template of one model."""

    def __init__(
        self,
        tokenizer: HFTokenizer,
        *,
        bos_token: str | None = None,
        eos_token: str | None = None,
        pad_token: str | None = None,
        unk_token: str | None = None,
        chat_template: str | None = None,
        extra_eos_token_ids: Iterable[int] = (),
    ) -> None:
        self._tk = tokenizer
        self.bos_token, self.eos_token = bos_token, eos_token
        self.pad_token, self.unk_token = pad_token, unk_token
        self.chat_template = chat_template
        self._template: jinja2.Template | None = None
        eos = [self.token_to_id(eos_token)] if eos_token else []
        ids = [i for i in [*extra_eos_token_ids, *eos] if i is not None]
        self._eos_ids = list(dict.fromkeys(ids))  # model config first, de-duplicated, order kept
        added = tokenizer.get_added_tokens_decoder()
        self._special = {i for i, tok in added.items() if tok.special}
        self._special.update(i for i in (self.bos_token_id, *self._eos_ids) if i is not None)
        self._text_cache: dict[int, str] = {}
        self._byte_level = type(tokenizer.decoder).__name__ == "ByteLevel"

    @classmethod
    def from_dir(cls, path: str | Path, extra_eos_token_ids: Iterable[int] = ()) -> Tokenizer:
        """Load tokenizer.json, tokenizer_config.json and chat_template.jinja from a HF folder.

        eos ids from config.json / generation_config.json in the same folder count as eos too, since
        chat models often end turns with a token the tokenizer config does not call eos.
        """
        path = Path(path)
        tj = path / "tokenizer.json"
        if not tj.is_file():
            raise ModelLoadError(f"{path}: missing tokenizer.json (a fast-tokenizer file is required)")
        try:
            tk = HFTokenizer.from_file(str(tj))
        except Exception as e:  # tokenizers raises a bare Exception on bad JSON
            raise ModelLoadError(f"{tj}: cannot load tokenizer ({e})") from e
        cfg = _read_json(path / "tokenizer_config.json")
        template = cfg.get("chat_template")
        if isinstance(template, list):  # older format: named templates
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default") or next(iter(named.values()), None)
        jinja_file = path / "chat_template.jinja"
        if jinja_file.is_file():  # transformers >= 4.50 saves the template here, and it wins there too
            template = jinja_file.read_text(encoding="utf-8")
        eos_ids = list(extra_eos_token_ids)
        for name in ("config.json", "generation_config.json"):
            eos_ids += _id_list(_read_json(path / name).get("eos_token_id"))
        return cls(
            tk,
            bos_token=_token_str(cfg.get("bos_token")),
            eos_token=_token_str(cfg.get("eos_token")),
            pad_token=_token_str(cfg.get("pad_token")),
            unk_token=_token_str(cfg.get("unk_token")),
            chat_template=template if isinstance(template, str) and template else None,
            extra_eos_token_ids=eos_ids,
        )

    # ---- vocabulary -------------------------------------------------------------------------
    @property
    def hf_tokenizer(self):
        """The underlying `tokenizers.Tokenizer` (grammar backends read its JSON)."""
        return self._tk

    @property
    def vocab_size(self) -> int:
        return self._tk.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token_id(self) -> int | None:
        return self.token_to_id(self.bos_token) if self.bos_token else None

    @property
    def eos_token_ids(self) -> list[int]:
        return list(self._eos_ids)

    @property
    def pad_token_id(self) -> int | None:
        return self.token_to_id(self.pad_token) if self.pad_token else None

    @property
    def special_token_ids(self) -> set[int]:
        return set(self._special)

    def token_to_id(self, token: str) -> int | None:
        return self._tk.token_to_id(token)

    def id_to_token(self, i: int) -> str:
        """Raw vocabulary entry (e.g. 'Ġworld'); '' for ids outside the vocabulary (padded embeddings)."""
        return self._tk.id_to_token(i) or ""

    def token_text(self, i: int) -> str:
        """Readable text of one token (e.g. ' world'); a lone partial UTF-8 byte shows as U+FFFD."""
        text = self._text_cache.get(i)
        if text is None:
            text = self._tk.decode([i], skip_special_tokens=False) if 0 <= i < self.vocab_size else ""
            self._text_cache[i] = text
        return text

    def token_bytes(self, i: int) -> bytes:
        """Exact bytes one token stands for (OpenAI logprobs `bytes`, grammar matching)."""
        tok = self.id_to_token(i)
        if i in self._special or not tok:
            return tok.encode("utf-8")
        if self._byte_level:
            inverse = _unicode_to_byte()
            if all(c in inverse for c in tok):
                return bytes(inverse[c] for c in tok)
        m = _BYTE_TOKEN.match(tok)
        if m:  # sentencepiece byte fallback
            return bytes([int(m.group(1), 16)])
        return tok.replace("\u2581", " ").encode("utf-8")

    # ---- text <-> ids -----------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """Token ids of `text`; special-token markup in it (e.g. <|im_start|>) maps to its special id."""
        if len(text) > GIL_FREE_CHARS:
            return self._tk.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids
        return self._tk.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str], add_special_tokens: bool = False) -> list[list[int]]:
        return [e.ids for e in self._tk.encode_batch(list(texts), add_special_tokens=add_special_tokens)]

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tk.decode(list(ids), skip_special_tokens=skip_special_tokens)

    # ---- chat ---------------------------------------------------------------------------------
    def _compiled_template(self) -> jinja2.Template:
        if self._template is None:
            try:
                self._template = _jinja_env().from_string(self.chat_template or CHATML_TEMPLATE)
            except jinja2.TemplateError as e:
                raise InvalidRequestError(f"the model's chat template does not compile: {e}") from e
        return self._template

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        tools: list[dict[str, Any]] | None = None,
        **kwargs: Any,
    ) -> str:
        """Render `messages` with the model's chat template (ChatML when it has none)."""
        if not isinstance(messages, list) or not all(isinstance(m, dict) and "role" in m for m in messages):
            raise InvalidRequestError("messages must be a list of objects with a 'role'")
        template = self._compiled_template()
        context = {
            "bos_token": self.bos_token or "",
            "eos_token": self.eos_token or "",
            "pad_token": self.pad_token or "",
            "unk_token": self.unk_token or "",
            **kwargs,
            "messages": messages,
            "tools": tools,
            "add_generation_prompt": add_generation_prompt,
        }
        try:
            return template.render(**context)
        except Exception as e:  # template code is untrusted: any failure is a bad request, not a crash
            raise InvalidRequestError(f"chat template failed: {type(e).__name__}: {e}") from e

    def encode_chat(self, messages: list[dict[str, Any]], **kwargs: Any) -> list[int]:
        """Ids of the rendered conversation; no extra BOS since templates write their own."""
        return self.encode(self.apply_chat_template(messages, **kwargs), add_special_tokens=False)


@lru_cache(maxsize=1)
def _unicode_to_byte() -> dict[str, int]:
    return {c: b for b, c in byte_to_unicode().items()}
