-- watukuy PostgreSQL store: the schema. migrate() runs this only when the schema is missing (so
-- a role without CREATE on the database can use an existing schema), inside the migration
-- transaction and under its advisory locks. {schema} is the validated schema name.
CREATE SCHEMA IF NOT EXISTS "{schema}"
