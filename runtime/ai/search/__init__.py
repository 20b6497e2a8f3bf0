"""AI Search, locally: namespaces of instances over uploaded files, an R2 bucket or a folder,
indexed (toMarkdown, token chunks with overlap, a keyword index and embeddings per chunk) and
searched or answered by the local models, per account. runtime.ai.search.service is the one
entry; the worker binding, the REST door and `edge ai-search` call it."""
