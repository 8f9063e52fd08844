"""ClickHouse as the fleet's event store: client, schema, backfill, test server."""
