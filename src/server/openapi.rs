//! The Lock API's OpenAPI 3 document, `docs/openapi.yaml`, compiled into the
//! binary and served at `GET /v1/openapi.yaml`: one file, so what a node
//! serves is what the repository ships. The tests check it against the wire
//! types; `.ci/openapi` checks it against a live node with schemathesis.

/// The document, byte for byte.
pub(super) const DOCUMENT: &str = include_str!("../../docs/openapi.yaml");

/// RFC 9512's media type for YAML.
pub(super) const CONTENT_TYPE: &str = "application/yaml";

#[cfg(test)]
mod tests;
