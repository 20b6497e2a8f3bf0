"""Each model's own tool-call format: how declared tools and a tool round trip are written into the
prompt, and the grammar a reply that may call tools must follow.

Two formats, picked from config.json's model_type (`format_for`):

- "kimi_k2" (deepseek_v3, kimi_k2): a reply's calls sit in one section,
  `<|tool_calls_section_begin|>` then per call `<|tool_call_begin|>functions.NAME:IDX`
  `<|tool_call_argument_begin|>{json arguments}<|tool_call_end|>`, then `<|tool_calls_section_end|>`;
  the tools are declared as a JSON list in a system turn of their own (role `tool_declare`) and a
  result comes back in a `tool` system turn headed `## Return of functions.NAME:IDX`.
- "glm45" (glm4_moe): each call is `<tool_call>NAME\\n` then `<arg_key>K</arg_key>\\n<arg_value>V`
  `</arg_value>\\n` per argument (a string argument raw, any other as JSON), then `</tool_call>`; the
  tools are declared in the system prompt and results come back as `<tool_response>` blocks in an
  observation turn.

A call's arguments are held to the function's schema with no keys it never named unless it says
so (`arguments_schema`: OpenAI's strict mode asks exactly this of every schema, so `strict: true`
changes nothing here), and no text in them may spell the format's own markers (`MARKERS`: a raw
GLM value's lexeme excludes them, every JSON string the schema lets the model write gets
engine.structured.tool_schema.excluding_pattern); a call is closed within max_tokens by the engine
(the guide's CallFormat, engine.structured.tool_close), and one cut off is dropped by the parser
(engine.structured.tool_parser), never returned in part.

The shipped miniatures' chat templates know plain {role, content} turns with string content only,
so `render_messages` writes every piece of a format's markup into the content of such turns (and
Kimi's tool turns as roles `tool_declare` and `tool`, GLM's results as an `observation` turn); the
template then renders them as the published templates do. The markers are single tokens of the
miniatures' tokenizers (models/recipe/tokenizer.py MARKER_TOKENS), decoded as text; a tool grammar
names each by its token where the tokenizer has one (`resolve_markers`). The streaming parser is
engine.structured.tool_parser.
"""

from __future__ import annotations

import json
import re
from typing import Any

from engine.errors import InvalidRequestError
from engine.structured.guide import MAX_GUIDE_CHARS, CallFormat, Guide, bounded_integers, with_json_options
from engine.structured.tool_schema import closed, extras_allowed, without_markers
from engine.structured.tool_types import ToolChoice, ToolFunction

KIMI_K2 = "kimi_k2"
GLM45 = "glm45"
FORMAT_OF_MODEL_TYPE = {"deepseek_v3": KIMI_K2, "kimi_k2": KIMI_K2, "glm4_moe": GLM45}

MAX_TOOLS = 128
TOOL_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
GLM_ARG_KEY = re.compile(r"[^<>\n]{1,128}")  # a key must not be able to close its own markup
MAX_CALL_INDEX_DIGITS = 6

# Kimi K2's markers
KIMI_SECTION_BEGIN = "<|tool_calls_section_begin|>"
KIMI_SECTION_END = "<|tool_calls_section_end|>"
KIMI_CALL_BEGIN = "<|tool_call_begin|>"
KIMI_ARGS_BEGIN = "<|tool_call_argument_begin|>"
KIMI_CALL_END = "<|tool_call_end|>"
# GLM-4.5's markers
GLM_CALL_BEGIN = "<tool_call>"
GLM_CALL_END = "</tool_call>"
GLM_KEY_BEGIN, GLM_KEY_END = "<arg_key>", "</arg_key>"
GLM_VALUE_BEGIN, GLM_VALUE_END = "<arg_value>", "</arg_value>"
# each format's call markup, which no argument's text may spell (a value holding `</tool_call>` would
# end its call early for the parser, one holding `<tool_call>` start another inside it)
MARKERS = {
    KIMI_K2: [KIMI_SECTION_BEGIN, KIMI_SECTION_END, KIMI_CALL_BEGIN, KIMI_ARGS_BEGIN, KIMI_CALL_END],
    GLM45: [GLM_CALL_BEGIN, GLM_CALL_END, GLM_KEY_BEGIN, GLM_KEY_END, GLM_VALUE_BEGIN, GLM_VALUE_END],
}
# the system turns Kimi K2 declares tools and returns results in (<|im_system|>tool_declare / tool)
KIMI_DECLARE, KIMI_RESULT = "tool_declare", "tool"
GLM_OBSERVATION = "observation"  # the turn GLM-4.5 reads tool results in (its <|observation|> token)


def format_for(model_type: str) -> str:
    """The tool-call format of a model type ("" for one without)."""
    return FORMAT_OF_MODEL_TYPE.get(model_type, "")


def check_tools(tools: list[ToolFunction], fmt: str, param: str = "tools") -> None:
    """Bound what a client declares: how many tools, their names and their schemas' size."""
    if not fmt:
        raise InvalidRequestError(param, "this model has no tool-call format; send no tools")
    if len(tools) > MAX_TOOLS:
        raise InvalidRequestError(param, f"give at most {MAX_TOOLS} tools, got {len(tools)}")
    names = [t.name for t in tools]
    for name in names:
        if not TOOL_NAME.fullmatch(name):
            raise InvalidRequestError(
                param, f"a function name must match ^[a-zA-Z0-9_-]{{1,64}}$, got {name!r}"
            )
    if len(set(names)) != len(names):
        raise InvalidRequestError(param, "function names must be unique")
    size = sum(len(json.dumps(t.parameters)) + len(t.description) for t in tools)
    if size > MAX_GUIDE_CHARS:
        raise InvalidRequestError(
            param, f"the tools are {size} characters; at most {MAX_GUIDE_CHARS} are taken"
        )
    for tool in tools:
        if tool.parameters.get("type", "object") != "object":
            raise InvalidRequestError(param, f"{tool.name}: parameters must be an object schema")
        if fmt == GLM45:
            for key in tool.parameters.get("properties") or {}:
                if not GLM_ARG_KEY.fullmatch(key):
                    raise InvalidRequestError(
                        param, f"{tool.name}: argument name {key!r} has '<', '>' or a newline"
                    )


# --- prompts -------------------------------------------------------------------------------------------


def _text(content: Any, where: str) -> str:
    """A message's content as text: a string, None, or a list of text parts."""
    if content is None or isinstance(content, str):
        return content or ""
    if isinstance(content, list):
        parts = []
        for part in content:
            if not (
                isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)
            ):
                raise InvalidRequestError(where, "content parts must be {'type': 'text', 'text': '...'}")
            parts.append(part["text"])
        return "".join(parts)
    raise InvalidRequestError(where, "content must be a string or a list of text parts")


def _declared(tools: list[ToolFunction]) -> list[dict[str, Any]]:
    return [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]


def _glm_declaration(tools: list[ToolFunction]) -> str:
    """The tools section of GLM-4.5's system prompt, worded as its published template words it."""
    lines = "\n".join(json.dumps(d, ensure_ascii=False) for d in _declared(tools))
    return (
        "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
        "You are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{lines}\n</tools>\n\n"
        "For each function call, output the function name and arguments within the following XML format:\n"
        f"{GLM_CALL_BEGIN}{{function-name}}\n{GLM_KEY_BEGIN}{{arg-key-1}}{GLM_KEY_END}\n"
        f"{GLM_VALUE_BEGIN}{{arg-value-1}}{GLM_VALUE_END}\n{GLM_KEY_BEGIN}{{arg-key-2}}{GLM_KEY_END}\n"
        f"{GLM_VALUE_BEGIN}{{arg-value-2}}{GLM_VALUE_END}\n...\n{GLM_CALL_END}"
    )


def _call_arguments(call: Any, where: str) -> tuple[str, str, str]:
    """An assistant message's tool call, OpenAI-shaped: (id, name, arguments text)."""
    fn = call.get("function") if isinstance(call, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise InvalidRequestError(
            where, "each tool call needs {'id', 'type': 'function', 'function': {'name', 'arguments'}}"
        )
    arguments = fn.get("arguments", "{}")
    if not isinstance(arguments, str):
        arguments = json.dumps(arguments, ensure_ascii=False)
    return str(call.get("id") or ""), fn["name"], arguments


def _glm_call(name: str, arguments: str, where: str) -> str:
    try:
        args = json.loads(arguments or "{}")
    except ValueError:
        raise InvalidRequestError(where, f"the arguments of {name!r} are not JSON") from None
    if not isinstance(args, dict):
        raise InvalidRequestError(where, f"the arguments of {name!r} must be a JSON object")
    pairs = "".join(
        f"{GLM_KEY_BEGIN}{k}{GLM_KEY_END}\n{GLM_VALUE_BEGIN}"
        f"{v if isinstance(v, str) else json.dumps(v, ensure_ascii=False)}{GLM_VALUE_END}\n"
        for k, v in args.items()
    )
    return f"{GLM_CALL_BEGIN}{name}\n{pairs}{GLM_CALL_END}"


def render_messages(
    fmt: str, messages: list[dict[str, Any]], tools: list[ToolFunction] | None = None
) -> list[dict[str, str]]:
    """OpenAI-shaped messages (roles system, developer, user, assistant, tool; content a string or a
    list of text parts; an assistant's `tool_calls` with `content: null`; a `tool` message's
    `tool_call_id`) and the declared tools, as the plain {role, content} turns the model's chat
    template takes, each format's markup written into their content. `tools` None or empty: none
    declared (tool_choice "none" declares none either). Plain string-content turns come out as they
    went in."""
    out: list[dict[str, str]] = []
    if tools:
        if fmt == KIMI_K2:
            out.append({"role": KIMI_DECLARE, "content": json.dumps(_declared(tools), ensure_ascii=False)})
        elif fmt == GLM45:
            out.append({"role": "system", "content": _glm_declaration(tools)})
    kimi_ids: dict[str, str] = {}  # an OpenAI call id -> Kimi's functions.NAME:IDX
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        role = message.get("role")
        text = _text(message.get("content"), f"{where}.content")
        if role in ("system", "developer"):
            if out and out[-1]["role"] == "system" and fmt == GLM45 and tools and len(out) == 1:
                out[-1] = {"role": "system", "content": out[-1]["content"] + "\n\n" + text}
            else:
                out.append({"role": "system", "content": text})
        elif role == "user":
            out.append({"role": "user", "content": text})
        elif role == "assistant":
            calls = message.get("tool_calls") or []
            if not isinstance(calls, list):
                raise InvalidRequestError(f"{where}.tool_calls", "must be a list")
            rendered = [_call_arguments(c, f"{where}.tool_calls") for c in calls]
            if rendered and fmt == KIMI_K2:
                pieces = []
                for call_id, name, arguments in rendered:
                    kimi_ids[call_id] = f"functions.{name}:{len(kimi_ids)}"
                    pieces.append(
                        f"{KIMI_CALL_BEGIN}{kimi_ids[call_id]}{KIMI_ARGS_BEGIN}{arguments}{KIMI_CALL_END}"
                    )
                text += KIMI_SECTION_BEGIN + "".join(pieces) + KIMI_SECTION_END
            elif rendered and fmt == GLM45:
                text += "".join(
                    "\n" + _glm_call(name, args, f"{where}.tool_calls") for _, name, args in rendered
                )
            elif rendered:
                raise InvalidRequestError(f"{where}.tool_calls", "this model has no tool-call format")
            out.append({"role": "assistant", "content": text})
        elif role == "tool":
            call_id = str(message.get("tool_call_id") or "")
            if fmt == KIMI_K2:
                out.append(
                    {"role": KIMI_RESULT, "content": f"## Return of {kimi_ids.get(call_id, call_id)}\n{text}"}
                )
            elif fmt == GLM45:
                block = f"<tool_response>\n{text}\n</tool_response>"
                if out and out[-1]["role"] == GLM_OBSERVATION:  # one observation turn per round
                    out[-1] = {"role": GLM_OBSERVATION, "content": out[-1]["content"] + "\n" + block}
                else:
                    out.append({"role": GLM_OBSERVATION, "content": block})
            else:
                raise InvalidRequestError(
                    f"{where}.role", "this model has no tool-call format for 'tool' messages"
                )
        else:
            raise InvalidRequestError(f"{where}.role", "must be system, developer, user, assistant or tool")
    return out


# --- grammars ------------------------------------------------------------------------------------------


def _lit(text: str) -> str:
    """A Lark string literal (JSON's escaping is Lark's)."""
    return json.dumps(text)


# A marker in a tool grammar is written between these two characters (json.dumps escapes both, so no
# name, key or schema can hold them); the guide's compiler (engine.structured.guided) turns each into the
# marker's own token where the tokenizer has it as one, else into a string literal. A literal would
# let the marker be spelled byte by byte, and where two markers share a start (Kimi's call and
# section-end markers after a call, GLM's key and call-end markers after a value) llguidance forces
# the shared bytes in its own tokenization: the model, which only saw the markers' tokens, would have
# to write `<|tool_call` letter by letter.
MARK_OPEN, MARK_CLOSE = "\x01", "\x02"
_MARKED = re.compile("\x01([^\x01\x02]+)\x02")


def _mark(marker: str) -> str:
    return f"{MARK_OPEN}{marker}{MARK_CLOSE}"


def _then(text: str, marker: str) -> str:
    """`text` (a literal; nothing when empty) and then `marker`."""
    return f"{_lit(text)} {_mark(marker)}" if text else _mark(marker)


def resolve_markers(grammar: str, token_of: dict[str, int]) -> str:
    """A tool grammar's markers as `<[id]>` (that token only) where `token_of` names their token,
    else as string literals."""
    return _MARKED.sub(lambda m: f"<[{token_of[m[1]]}]>" if m[1] in token_of else _lit(m[1]), grammar)


def _json(schema: dict[str, Any], fmt: str) -> str:
    """An argument's JSON as a Lark `%json` whose strings never spell `fmt`'s markers (llguidance's
    lexemes take a marker token's text like any other text, so only the schema can refuse it)."""
    return "%json " + json.dumps(with_json_options(without_markers(bounded_integers(schema), MARKERS[fmt])))


def _re(text: str) -> str:
    """`text` matched literally inside a Lark /regex/."""
    return re.escape(text).replace("/", "\\/")


def _excluding(marker: str) -> str:
    """A Lark regex for any text that does not contain `marker`."""
    return rf"/(?s:.*)/ & ~/(?s:.*){_re(marker)}(?s:.*)/"


def arguments_schema(tool: ToolFunction) -> dict[str, Any]:
    """The schema a call's arguments are held to: the tool's, its objects taking no keys it never
    named unless it says they may (engine.structured.tool_schema.closed; OpenAI's strict mode has every
    object say so, and `strict: true` asks for exactly this schema)."""
    return closed(tool.parameters)


def _kimi_rules(tools: list[ToolFunction]) -> list[str]:
    """`call`: one call, its begin marker first; `body`: one call after that marker."""
    rules = [
        f"call: {_mark(KIMI_CALL_BEGIN)} body",
        "body: " + " | ".join(f"body_{i}" for i in range(len(tools))),
    ]
    for i, tool in enumerate(tools):
        args = f"{_mark(KIMI_ARGS_BEGIN)} {_json(arguments_schema(tool), KIMI_K2)} {_mark(KIMI_CALL_END)}"
        rules.append(f"body_{i}: {_lit(f'functions.{tool.name}:')} CALL_INDEX {args}")
    rules.append(f"CALL_INDEX: /[0-9]{{1,{MAX_CALL_INDEX_DIGITS}}}/")
    return rules


def glm_raw_string(schema: Any) -> bool:
    """Whether GLM-4.5 writes an argument of this schema as raw text (a string, at most an enum of
    them, typed or not) rather than as JSON: the grammar and the parser must agree."""
    if not isinstance(schema, dict) or not set(schema) <= {"type", "description", "title", "enum"}:
        return False
    enum = schema.get("enum")
    strings = isinstance(enum, list) and bool(enum) and all(isinstance(v, str) for v in enum)
    return schema.get("type") == "string" and (enum is None or strings) or ("type" not in schema and strings)


def glm_raw_keys(tool: ToolFunction) -> list[str]:
    """The arguments GLM-4.5 writes raw for `tool` (the grammar's and the parser's one answer),
    with "*" when undeclared ones are allowed and raw too."""
    schema = arguments_schema(tool)
    props: dict[str, Any] = schema.get("properties") or {}
    raw = [k for k, s in props.items() if glm_raw_string(s)]
    extra = schema.get("additionalProperties", True)
    if extras_allowed(schema) and (not isinstance(extra, dict) or glm_raw_string(extra)):
        raw.append("*")
    return raw


def _glm_value(schema: Any) -> str:
    if glm_raw_string(schema) and schema.get("enum"):
        return "(" + " | ".join(_then(v, GLM_VALUE_END) for v in schema["enum"]) + ")"
    if glm_raw_string(schema):
        return "STRING_VALUE_END"
    return f"{_json(schema if isinstance(schema, dict) else {}, GLM45)} {_mark(GLM_VALUE_END)}"


def _glm_rules(tools: list[ToolFunction]) -> list[str]:
    """`body`: one call after its `<tool_call>` marker (the marker opens `call`, or ends TEXT_OPEN)."""
    # a raw value is text up to its end marker, with no other marker of the format in it
    others = [m for m in MARKERS[GLM45] if m != GLM_VALUE_END]
    rules = [_up_to(GLM_VALUE_END, "STRING_VALUE_END", others), r"ANY_KEY: /[^<>\n]{1,128}/"]
    rules.append("body: " + " | ".join(f"body_{i}" for i in range(len(tools))))
    rules.append(f"call: {_mark(GLM_CALL_BEGIN)} body")
    for i, tool in enumerate(tools):
        params = arguments_schema(tool)
        props: dict[str, Any] = params.get("properties") or {}
        required = set(params.get("required") or [])
        args = []
        for j, (key, schema) in enumerate(props.items()):
            opening = (
                f"{_mark(GLM_KEY_BEGIN)} {_then(key, GLM_KEY_END)} {_lit(chr(10))} {_mark(GLM_VALUE_BEGIN)}"
            )
            rules.append(f"arg_{i}_{j}: {opening} {_glm_value(schema)} {_lit(chr(10))}")
            args.append(f"arg_{i}_{j}" + ("" if key in required else "?"))
        if extras_allowed(params):  # keys it never named, as the schema lets in (raw, unless typed)
            extra = params.get("additionalProperties", True)
            value = _glm_value(extra) if isinstance(extra, dict) else "STRING_VALUE_END"
            opening = _mark(GLM_KEY_BEGIN)
            middle = f"{_mark(GLM_KEY_END)} {_lit(chr(10))} {_mark(GLM_VALUE_BEGIN)}"
            rules.append(f"arg_{i}_any: {opening} ANY_KEY {middle} {value} {_lit(chr(10))}")
            args.append(f"arg_{i}_any*")
        rules.append(f"body_{i}: {_lit(tool.name + chr(10))} {' '.join(args)} {_mark(GLM_CALL_END)}")
    return rules


def _up_to(marker: str, name: str, excluded: list[str] | tuple[str, ...] = ()) -> str:
    """A lexeme for text up to and including the first `marker`: one lexeme, so that the marker
    ends the text (a text lexeme followed by the marker's own would swallow the marker's bytes);
    with none of `excluded` anywhere in it (a regex's complement: llguidance has no look-ahead)."""
    m = _re(marker)
    rule = rf"{name}: /(?s:.*){m}/ & ~/(?s:.*){m}(?s:.+)/"
    if excluded:
        rule += " & ~/(?s:.*)(?:" + "|".join(_re(x) for x in excluded) + ")(?s:.*)/"
    return rule


def _opened_by(marker: str) -> list[str]:
    """TEXT (no `marker` in it) and TEXT_OPEN (text up to and including the first `marker`)."""
    return [f"TEXT: {_excluding(marker)}", _up_to(marker, "TEXT_OPEN")]


def tool_grammar(fmt: str, tools: list[ToolFunction], choice: ToolChoice, parallel: bool) -> str:
    """The Lark grammar (llguidance's dialect) of a reply under `choice` ("auto", "required" or a
    function's name): calls are well formed and their arguments follow each function's schema."""
    if choice not in ("auto", "required"):
        tools, parallel = [t for t in tools if t.name == choice], False
    if fmt == KIMI_K2:
        rules = _kimi_rules(tools)
        more = " call*" if parallel else ""
        whole = f"{_mark(KIMI_SECTION_BEGIN)} call{more} {_mark(KIMI_SECTION_END)}"
        # after "auto"'s text (a lexeme that takes any text) llguidance lets no marker token in; the
        # first call's marker there is text, which the model's marker token spells
        opened = f"{_lit(KIMI_CALL_BEGIN)} body{more} {_mark(KIMI_SECTION_END)}"
        opener = KIMI_SECTION_BEGIN
    elif fmt == GLM45:
        rules = _glm_rules(tools)
        more = ' ("\\n" call)*' if parallel else ""
        opener, whole, opened = GLM_CALL_BEGIN, f"call{more}", f"body{more}"
    else:
        raise InvalidRequestError("tools", "this model has no tool-call format; send no tools")
    if choice != "auto":
        return "\n".join([f"start: {whole}", *rules]) + "\n"
    # "auto": text without the opening marker, or text up to it and then the calls
    return "\n".join([f"start: TEXT | TEXT_OPEN {opened}", *rules, *_opened_by(opener)]) + "\n"


def _keys_required_first(tool: ToolFunction) -> list[str]:
    props = list(arguments_schema(tool).get("properties") or {})
    required = set(tool.parameters.get("required") or [])
    return [k for k in props if k in required] + [k for k in props if k not in required]


def guide_for(
    fmt: str, tools: list[ToolFunction] | None, tool_choice: ToolChoice, parallel_tool_calls: bool = True
) -> Guide | None:
    """The guide a reply follows when it may call `tools`: "required", one or more calls (one if not
    parallel) and nothing else; a function's name, exactly that call; "auto", plain text, or text
    then the calls (well formed, arguments per each schema); "none" or no tools: no guide."""
    if not tools or tool_choice == "none":
        return None
    if tool_choice not in ("auto", "required") and tool_choice not in {t.name for t in tools}:
        raise InvalidRequestError("tool_choice", f"names no declared function: {tool_choice!r}")
    grammar = tool_grammar(fmt, tools, tool_choice, parallel_tool_calls)
    callable_ = tools if tool_choice in ("auto", "required") else [t for t in tools if t.name == tool_choice]
    calls = CallFormat(
        fmt=fmt,
        names=[t.name for t in callable_],
        keys={t.name: _keys_required_first(t) for t in callable_},
        raw={t.name: glm_raw_keys(t) for t in callable_} if fmt == GLM45 else {},
        opened=tool_choice != "auto",
    )
    return Guide(kind="lark", grammar=grammar, calls=calls)
