"""One model step: the runner (a step's inputs, the choice of forward, the logits), the compiled
decode graphs per bucket and the key they are shared by, and the MTP drafts run beside it."""
