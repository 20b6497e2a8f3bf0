"""What fires a worker without HTTP: cron triggers, queue consumers and Durable Object alarms."""
