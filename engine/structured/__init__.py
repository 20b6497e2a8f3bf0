"""The structure of an answer, from the grammar that shapes it to the parts a client sees: guides
(JSON, schemas, regexes, tool calls) compiled for guided decoding and closed within max_tokens, each
family's tool-call and reasoning formats with their parsers, and the choices assembled from a
request's token events (text, tool calls, reasoning, logprobs). The edge asks this room once per
event; nothing here knows PoPs or HTTP shapes."""
