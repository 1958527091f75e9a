//! The OpenAPI description of the HTTP API, generated from the handlers' `#[utoipa::path]`
//! attributes and the request and response types' schemas. `docs/openapi.json` is this
//! document as committed; a test fails when the two drift apart.

use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi};

use crate::routes;

/// The API as utoipa derives it.
#[derive(Debug, OpenApi)]
#[openapi(
    info(
        title = "Tlaloc",
        description = "An OpenAI-compatible server for language models: completions, chat \
            completions (with server-sent event streaming, structured outputs and tool calling) \
            and stateless responses, the served model, tokenization, and the server's health, \
            readiness and metrics.",
        license(name = "Apache-2.0", identifier = "Apache-2.0"),
    ),
    paths(
        routes::completions,
        routes::chat_completions,
        routes::responses,
        routes::models,
        routes::tokenize,
        routes::detokenize,
        routes::health,
        routes::ready,
        routes::metrics,
        routes::openapi_json,
    ),
    modifiers(&ApiKey),
    tags(
        (name = "openai", description = "The OpenAI-compatible endpoints."),
        (name = "tlaloc", description = "Tokenization with the served model's tokenizer."),
        (name = "server", description = "Health, readiness, metrics and this description."),
    ),
)]
struct ApiDoc;

/// Declares the `api_key` scheme the protected routes name: the key the server was started
/// with, as a bearer token (required only when the server has one, hence each route's empty
/// alternative).
#[derive(Debug)]
struct ApiKey;

impl Modify for ApiKey {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The key given to `tlaloc serve --api-key`, as `Authorization: Bearer <key>`.",
                    ))
                    .build(),
            ),
        );
    }
}

/// The OpenAPI description of the server.
pub fn openapi() -> utoipa::openapi::OpenApi {
    ApiDoc::openapi()
}

/// [`openapi`] as the pretty-printed JSON committed in `docs/openapi.json` (with a final
/// newline).
pub fn openapi_json() -> String {
    let mut json = openapi()
        .to_pretty_json()
        .expect("the OpenAPI document serializes to JSON");
    json.push('\n');
    json
}
