"""The AI service behind env.AI.run and the AI REST doors: a call's mode decided once, its inputs validated
once into the typed request, its answer shaped once from GenerateResult. Knows no HTTP routes and no
isolates."""
