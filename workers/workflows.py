"""Workflow exceptions, at the path Cloudflare's SDK has them (`workers.workflows`)."""


class NonRetryableError(Exception):
    """Raised in a workflow step: the step must not be retried. Workflows are not simulated yet."""
