"""What fires a worker without HTTP: cron triggers and queue consumers."""
