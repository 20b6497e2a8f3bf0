"""The AI service and what every AI door shares (env.AI.run, the AI REST, OpenAI and Responses doors, AI
Gateway's): one call object made at the door (runtime.ai.call.AICall), its mode decided once, its inputs
validated once into the typed request, recorded once (runtime.control.ai_record), its answer shaped once
from GenerateResult. Knows no HTTP routes and no isolates."""
