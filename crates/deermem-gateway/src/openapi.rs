//! The OpenAPI 3.1 description of the gateway, generated from the router with `aide`: every
//! route [`crate::router`] serves is documented where it is routed (its path and methods come
//! from the router itself, its success body from the handler's return type, its parameters,
//! request body and own errors from the transform beside it), and the component schemas come
//! from the wire types' `JsonSchema` derivations (serde renames, defaults,
//! `skip_serializing_if` and `flatten` included).
//!
//! Responses are described with the *serialize* contract (a field that is always written is
//! `required`), request bodies with the *deserialize* contract (a field with a default is
//! optional). When a type reads differently from how it is written (the import document, whose
//! every field has a default), its request form is a separate component named `<Name>-Input`.
//! The errors every `/api` route shares are added per group ([`api_errors`], with or without
//! the gate's), never over an operation's own.
//!
//! Each [`crate::router`] call generates the document (with the `/docs` page and the route
//! templates the fallback redirects to) once, in [`finish`], and hands it to its routes as an
//! axum `Extension`.

use std::collections::BTreeMap;
use std::marker::PhantomData;
use std::sync::Arc;

use aide::axum::ApiRouter;
use aide::generate::{GenContext, in_context};
use aide::openapi::{
    MediaType, OpenApi, Operation, PathItem, ReferenceOr, RequestBody, Response, SchemaObject,
    StatusCode,
};
use aide::operation::{ParamLocation, add_parameters, parameters_from_schema};
use aide::transform::{TransformOperation, TransformPathItem};
use aide::{OperationInput, OperationOutput};
use axum::Router;
use axum::body::Bytes;
use deermem_core::PublicMemoryDocument;
use schemars::generate::SchemaSettings;
use schemars::{JsonSchema, SchemaGenerator};
use serde_json::{Map, Value, json};

use crate::auth::Caller;
use crate::body::JsonDocument;
use crate::error::GatewayError;
use crate::extract::{Call, ImportBody, JsonBody, QueryParams};
use crate::limits::BulkPermit;
use crate::schema::{HttpError, HttpValidationError, Unauthorized};
use crate::state::GatewayState;

/// The served document, its `/docs` page and the route templates, built once.
#[derive(Debug)]
pub(crate) struct Document {
    /// `/openapi.json`'s body.
    pub(crate) json: Bytes,
    /// `/docs`'s body.
    pub(crate) html: String,
    /// Every documented path template, for the trailing-slash redirect.
    pub(crate) paths: Vec<String>,
}

// Handler inputs and outputs: what they add to the document.

impl OperationInput for Caller {}
impl OperationInput for Call {}
impl OperationInput for QueryParams {}
impl OperationInput for JsonBody {}
impl OperationInput for ImportBody {}
impl OperationInput for BulkPermit {}

impl OperationOutput for GatewayError {
    type Inner = ();
}

/// Documented as aide documents `Json<PublicMemoryDocument>`.
impl OperationOutput for JsonDocument {
    type Inner = PublicMemoryDocument;

    fn operation_response(ctx: &mut GenContext, op: &mut Operation) -> Option<Response> {
        axum::Json::<PublicMemoryDocument>::operation_response(ctx, op)
    }

    fn inferred_responses(
        ctx: &mut GenContext,
        op: &mut Operation,
    ) -> Vec<(Option<StatusCode>, Response)> {
        axum::Json::<PublicMemoryDocument>::inferred_responses(ctx, op)
    }
}

/// A JSON request body of type `T`, read with the deserialize contract (see the module
/// documentation); for the document only, the handlers read [`JsonBody`].
#[derive(Debug)]
pub(crate) struct Body<T>(PhantomData<T>);

/// Where an operation carries its request-side component schemas until [`finish`] merges
/// them (never served).
const INPUT_SCHEMAS: &str = "x-deermem-input-schemas";

impl<T: JsonSchema> OperationInput for Body<T> {
    fn operation_input(_: &mut GenContext, operation: &mut Operation) {
        let mut generator = generator(false);
        let schema = generator.subschema_for::<T>();
        let definitions = generator.take_definitions(true);
        operation
            .extensions
            .insert(INPUT_SCHEMAS.into(), Value::Object(definitions));
        operation.request_body = Some(ReferenceOr::Item(RequestBody {
            required: true,
            content: [("application/json".to_owned(), media(schema.to_value()))].into(),
            ..RequestBody::default()
        }));
    }
}

/// Query parameters: each property of `T` (read with the deserialize contract, so an `Option`
/// is not required); for the document only, the handlers read [`QueryParams`].
#[derive(Debug)]
pub(crate) struct InQuery<T>(PhantomData<T>);

/// Path parameters: each property of `T`.
#[derive(Debug)]
pub(crate) struct InPath<T>(PhantomData<T>);

fn parameters<T: JsonSchema>(ctx: &mut GenContext, operation: &mut Operation, at: ParamLocation) {
    let schema = generator(false).into_root_schema_for::<T>();
    let params = parameters_from_schema(ctx, schema, at);
    add_parameters(ctx, operation, params);
}

impl<T: JsonSchema> OperationInput for InQuery<T> {
    fn operation_input(ctx: &mut GenContext, operation: &mut Operation) {
        parameters::<T>(ctx, operation, ParamLocation::Query);
    }
}

impl<T: JsonSchema> OperationInput for InPath<T> {
    fn operation_input(ctx: &mut GenContext, operation: &mut Operation) {
        parameters::<T>(ctx, operation, ParamLocation::Path);
    }
}

fn ctx_schema<T: JsonSchema>(ctx: &mut GenContext) -> Value {
    ctx.schema.subschema_for::<T>().to_value()
}

fn media(schema: Value) -> MediaType {
    MediaType {
        schema: schema.try_into().ok().map(|json_schema| SchemaObject {
            json_schema,
            example: None,
            external_docs: None,
        }),
        ..MediaType::default()
    }
}

fn json_response(
    ctx: &mut GenContext,
    description: &str,
    schema: fn(&mut GenContext) -> Value,
) -> Response {
    Response {
        description: description.to_owned(),
        content: [("application/json".to_owned(), media(schema(ctx)))].into(),
        ..Response::default()
    }
}

/// Documenting an operation beside its route.
pub(crate) trait Describe: Sized {
    /// Operation id and summary.
    fn named(self, id: &str, summary: &str) -> Self;
    /// A response with an `HTTPError` body.
    fn error<const N: u16>(self, description: &str) -> Self;
    /// A response with a JSON body of type `T`.
    fn reply<const N: u16, T: JsonSchema>(self, description: &str) -> Self;
    /// A response with a body of another media type (`schema` `{"type": "string"}` unless
    /// JSON).
    fn raw<const N: u16>(self, content_type: &str, description: &str) -> Self;
}

impl Describe for TransformOperation<'_> {
    fn named(self, id: &str, summary: &str) -> Self {
        self.id(id).summary(summary)
    }

    fn error<const N: u16>(self, description: &str) -> Self {
        self.reply::<N, HttpError>(description)
    }

    fn reply<const N: u16, T: JsonSchema>(mut self, description: &str) -> Self {
        let response = in_context(|ctx| json_response(ctx, description, ctx_schema::<T>));
        put(self.inner_mut(), N, response, true);
        self
    }

    fn raw<const N: u16>(mut self, content_type: &str, description: &str) -> Self {
        let schema = if content_type == "application/json" {
            json!({ "type": "object" })
        } else {
            json!({ "type": "string" })
        };
        let response = Response {
            description: description.to_owned(),
            content: [(content_type.to_owned(), media(schema))].into(),
            ..Response::default()
        };
        put(self.inner_mut(), N, response, true);
        self
    }
}

/// Sets a response; `replace: false` keeps one already there (an operation's own responses
/// take precedence over the shared ones).
fn put(op: &mut Operation, status: u16, response: Response, replace: bool) {
    let responses = op.responses.get_or_insert_with(Default::default);
    let code = StatusCode::Code(status);
    if replace || !responses.responses.contains_key(&code) {
        responses
            .responses
            .insert(code, ReferenceOr::Item(response));
    }
}

fn operations(item: &mut PathItem) -> impl Iterator<Item = &mut Operation> {
    [
        &mut item.get,
        &mut item.put,
        &mut item.post,
        &mut item.patch,
        &mut item.delete,
    ]
    .into_iter()
    .flatten()
}

/// The errors of an authenticated `/api` route (and the `memory` tag): authentication and
/// validation, and with `gated` (the data routes, behind the `memory.enabled` gate) every
/// other shared one.
pub(crate) fn api_errors(mut item: TransformPathItem<'_>, gated: bool) -> TransformPathItem<'_> {
    in_context(|ctx| {
        for op in operations(item.inner_mut()) {
            op.tags = vec!["memory".into()];
            let mut shared = vec![
                (400, "Invalid id, agent name or argument"),
                (
                    401,
                    "Not authenticated (in deerflow_session mode with DeerFlow's {code, message} detail)",
                ),
                (
                    403,
                    "A cookie-authenticated write without DeerFlow's CSRF pair, or a Host/Origin the unauthenticated mode does not serve",
                ),
                (422, "Validation error"),
            ];
            if op.request_body.is_some() {
                shared.push((413, "Body larger than gateway.max_body_bytes"));
            }
            if gated {
                shared.extend([
                    (409, "Memory changed concurrently; reload and retry"),
                    (500, "Stored data corrupted, or persistence failed"),
                    (501, "The backend does not support the operation"),
                    (503, "Memory disabled, or the backend is unavailable"),
                    (504, "Request or backend timed out"),
                ]);
            }
            for (status, description) in shared {
                let schema: fn(&mut GenContext) -> Value = match status {
                    401 => ctx_schema::<Unauthorized>,
                    422 => ctx_schema::<HttpValidationError>,
                    _ => ctx_schema::<HttpError>,
                };
                put(op, status, json_response(ctx, description, schema), false);
            }
        }
    });
    item
}

/// For the operational routes: no authentication (an empty `security`), the `operations` tag.
pub(crate) fn open(mut item: TransformPathItem<'_>) -> TransformPathItem<'_> {
    for op in operations(item.inner_mut()) {
        op.tags = vec!["operations".into()];
        // aide leaves an empty `security` out; an explicit `[]` overrides the global one.
        op.extensions.insert("security".into(), json!([]));
    }
    item
}

const SCHEMAS_PATH: &str = "#/components/schemas/";

fn generator(serialize: bool) -> SchemaGenerator {
    let settings = SchemaSettings::draft2020_12().with(|s| {
        s.definitions_path = "/components/schemas".into();
        s.meta_schema = None;
    });
    if serialize {
        settings.for_serialize().into_generator()
    } else {
        settings.for_deserialize().into_generator()
    }
}

/// Starts a document on this thread: aide's generator, with the response contract.
pub(crate) fn start() {
    in_context(|ctx| ctx.schema = generator(true));
}

/// Turns the documented router into the served one, with its document (the router serves
/// it from an `Extension`).
pub(crate) fn finish(app: ApiRouter<GatewayState>) -> (Router<GatewayState>, Arc<Document>) {
    let mut api = OpenApi::default();
    let router = app.finish_api(&mut api);
    let doc = document(&api);
    let paths = doc["paths"]
        .as_object()
        .map(|p| p.keys().cloned().collect())
        .unwrap_or_default();
    let json = serde_json::to_vec(&doc)
        .map(Bytes::from)
        .unwrap_or_default();
    let html = crate::ops::docs_html(&doc);
    (router, Arc::new(Document { json, html, paths }))
}

/// The served JSON: aide's paths and components, the request-side components merged in, the
/// responses in status order, and the document's own description.
fn document(api: &OpenApi) -> Value {
    let generated = serde_json::to_value(api).unwrap_or(Value::Null);
    let mut paths = generated["paths"].as_object().cloned().unwrap_or_default();
    let outputs = generated["components"]["schemas"]
        .as_object()
        .cloned()
        .unwrap_or_default();
    let mut inputs = Map::new();
    for op in json_operations(&mut paths) {
        if let Some(Value::Object(defs)) = op.remove(INPUT_SCHEMAS) {
            inputs.extend(defs);
        }
    }
    let (schemas, renamed) = merge_components(outputs, inputs);
    for op in json_operations(&mut paths) {
        // A parameter's description is its own, not its schema's too.
        if let Some(Value::Array(params)) = op.get_mut("parameters") {
            for p in params.iter_mut() {
                if let Some(Value::Object(schema)) = p.get_mut("schema") {
                    schema.remove("description");
                }
            }
        }
        if let Some(body) = op.get_mut("requestBody") {
            visit_refs(body, &mut |name| renamed.get(name).cloned());
        }
        if let Some(Value::Object(responses)) = op.get_mut("responses") {
            // An inferred success body says "OK": aide leaves the description of a type
            // without documentation empty, and uses the documentation of any other, which is
            // about the type.
            for r in responses.values_mut() {
                let component = r["content"]["application/json"]["schema"]["$ref"]
                    .as_str()
                    .and_then(|name| name.strip_prefix(SCHEMAS_PATH))
                    .and_then(|name| schemas.get(name));
                if r["description"].as_str().is_some_and(str::is_empty)
                    || component.is_some_and(|c| c.get("description") == r.get("description"))
                {
                    r["description"] = json!("OK");
                }
            }
            // Three-digit codes: their text order is their numeric order.
            responses.sort_keys();
        }
    }
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "DeerMem gateway",
            "version": env!("CARGO_PKG_VERSION"),
            "description": "DeerFlow-compatible /api/memory routes plus extensions. With gateway.auth.mode: token, send Authorization: Bearer <token>; with deerflow_session, DeerFlow's access_token cookie (and, on writes, the csrf_token cookie repeated in X-CSRF-Token); internal callers send X-DeerFlow-Internal-Token (and optionally X-DeerFlow-Owner-User-Id)."
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "bearerAuth": { "type": "http", "scheme": "bearer" },
                "internalToken": { "type": "apiKey", "in": "header", "name": "X-DeerFlow-Internal-Token" },
                "sessionCookie": { "type": "apiKey", "in": "cookie", "name": "access_token" }
            }
        },
        "security": [ {}, { "bearerAuth": [] }, { "internalToken": [] }, { "sessionCookie": [] } ]
    })
}

/// Every operation of the document's paths.
fn json_operations(
    paths: &mut Map<String, Value>,
) -> impl Iterator<Item = &mut Map<String, Value>> {
    let items = paths.values_mut().filter_map(Value::as_object_mut);
    items.flat_map(|item| item.values_mut().filter_map(Value::as_object_mut))
}

/// Calls `f` with the component name of every `$ref` in `v`, and points the reference at the
/// component `f` answers with, if any.
fn visit_refs(v: &mut Value, f: &mut impl FnMut(&str) -> Option<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m.iter_mut() {
                if k == "$ref"
                    && let Some(new) = x
                        .as_str()
                        .and_then(|r| r.strip_prefix(SCHEMAS_PATH))
                        .and_then(&mut *f)
                {
                    *x = Value::String(format!("{SCHEMAS_PATH}{new}"));
                }
                visit_refs(x, f);
            }
        }
        Value::Array(a) => a.iter_mut().for_each(|x| visit_refs(x, f)),
        _ => {}
    }
}

/// Merges the request-side components into the response-side ones: a request schema equal to
/// the response schema of the same name (and referring only to shared components) is shared;
/// any other gets its own `<Name>-Input` component.
fn merge_components(
    mut outputs: Map<String, Value>,
    inputs: Map<String, Value>,
) -> (Map<String, Value>, BTreeMap<String, String>) {
    // A schema referring to a renamed one differs too, even if its text is equal.
    let mut renamed: BTreeMap<String, String> = BTreeMap::new();
    loop {
        let differs = |name: &String, schema: &Value| {
            let mut refers_to_renamed = false;
            visit_refs(&mut schema.clone(), &mut |n| {
                refers_to_renamed |= renamed.contains_key(n);
                None
            });
            !renamed.contains_key(name)
                && outputs
                    .get(name)
                    .is_some_and(|o| o != schema || refers_to_renamed)
        };
        let more: Vec<String> = inputs
            .iter()
            .filter(|(name, schema)| differs(name, schema))
            .map(|(name, _)| name.clone())
            .collect();
        if more.is_empty() {
            break;
        }
        renamed.extend(
            more.into_iter()
                .map(|name| (name.clone(), format!("{name}-Input"))),
        );
    }
    for (name, mut schema) in inputs {
        visit_refs(&mut schema, &mut |n| renamed.get(n).cloned());
        let key = renamed.get(&name).cloned().unwrap_or(name);
        outputs.entry(key).or_insert(schema);
    }
    (outputs, renamed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn merging_renames_only_what_differs() {
        let outputs: Map<String, Value> = serde_json::from_value(json!({
            "A": {"type": "object", "required": ["x"]},
            "B": {"type": "object", "properties": {"a": {"$ref": "#/components/schemas/A"}}},
            "C": {"type": "string"}
        }))
        .unwrap();
        let inputs: Map<String, Value> = serde_json::from_value(json!({
            "A": {"type": "object"},
            "B": {"type": "object", "properties": {"a": {"$ref": "#/components/schemas/A"}}},
            "C": {"type": "string"},
            "D": {"type": "integer"}
        }))
        .unwrap();
        let (merged, renamed) = merge_components(outputs, inputs);
        assert_eq!(
            renamed.keys().cloned().collect::<Vec<_>>(),
            vec!["A".to_owned(), "B".to_owned()]
        );
        assert_eq!(merged["A-Input"], json!({"type": "object"}));
        assert_eq!(
            merged["B-Input"]["properties"]["a"]["$ref"],
            "#/components/schemas/A-Input"
        );
        assert_eq!(
            merged["B"]["properties"]["a"]["$ref"],
            "#/components/schemas/A"
        );
        assert!(merged.contains_key("C") && !merged.contains_key("C-Input"));
        assert!(merged.contains_key("D"));
    }
}
