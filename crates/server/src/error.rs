//! Errors: [`Error`] for starting the server, [`ApiError`] for what a request gets back (an
//! HTTP status with an OpenAI-style body, `{"error": {"message", "type", "param", "code"}}`).

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// No model was given.
    #[error("no model to serve: give --model, --embedding-model or --rerank-model")]
    NoModel,
    /// The address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address.
        addr: String,
        /// The cause.
        source: std::io::Error,
    },
    /// Another I/O failure (runtime, accept loop).
    #[error("server I/O error: {0}")]
    Io(#[from] std::io::Error),
}

/// Result with the crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// An error answered to a client.
#[derive(Debug, Clone)]
pub struct ApiError {
    /// HTTP status.
    pub status: StatusCode,
    /// OpenAI error type (`invalid_request_error`, `authentication_error`, ...).
    pub kind: &'static str,
    /// What went wrong, for a person.
    pub message: String,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    /// A machine-readable code (`model_not_found`, ...).
    pub code: Option<&'static str>,
}

impl ApiError {
    fn new(status: StatusCode, kind: &'static str, message: impl Into<String>) -> Self {
        Self {
            status,
            kind,
            message: message.into(),
            param: None,
            code: None,
        }
    }

    /// 400: the request is malformed or a value is out of range.
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
    }

    /// 400 naming the field at fault.
    pub fn invalid_param(param: impl Into<String>, message: impl Into<String>) -> Self {
        let mut e = Self::invalid(message);
        e.param = Some(param.into());
        e
    }

    /// 401: missing or wrong API key.
    pub fn unauthorized() -> Self {
        let mut e = Self::new(
            StatusCode::UNAUTHORIZED,
            "authentication_error",
            "missing or invalid API key: send `Authorization: Bearer KEY`",
        );
        e.code = Some("invalid_api_key");
        e
    }

    /// 404: the named model is not served here.
    pub fn model_not_found(name: &str, served: &[String]) -> Self {
        let mut e = Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!(
                "the model `{name}` is not served here; served: {}",
                if served.is_empty() {
                    "none of this kind".to_string()
                } else {
                    served.join(", ")
                }
            ),
        );
        e.param = Some("model".into());
        e.code = Some("model_not_found");
        e
    }

    /// 403: the request asks for something this server does not allow (e.g. a path outside
    /// the folder it may read).
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(StatusCode::FORBIDDEN, "permission_error", message)
    }

    /// 404: a named thing (other than a model) does not exist.
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, "invalid_request_error", message)
    }

    /// 404 for a route whose model kind is not loaded.
    pub fn not_loaded(what: &str, flag: &str) -> Self {
        let mut e = Self::new(
            StatusCode::NOT_FOUND,
            "invalid_request_error",
            format!("no {what} model is loaded (start the server with {flag})"),
        );
        e.code = Some("model_not_found");
        e
    }

    /// 413: the body is over the limit.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is larger than the limit of {limit} bytes"),
        )
    }

    /// 408: the body did not arrive in time.
    pub fn body_timeout(limit: std::time::Duration) -> Self {
        Self::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            format!(
                "the request body did not arrive within {} s",
                limit.as_secs_f64()
            ),
        )
    }

    /// 429: too many connections are open.
    pub fn too_many_connections(limit: usize) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!("the server has {limit} connections open, its limit; retry later"),
        );
        e.code = Some("too_many_connections");
        e
    }

    /// 429: the queue is full.
    pub fn overloaded(limit: usize) -> Self {
        let mut e = Self::new(
            StatusCode::TOO_MANY_REQUESTS,
            "rate_limit_error",
            format!("the server is at capacity ({limit} requests in flight); retry later"),
        );
        e.code = Some("queue_full");
        e
    }

    /// 503: the engine behind the route has stopped.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(StatusCode::SERVICE_UNAVAILABLE, "server_error", message)
    }

    /// 500: the engine failed on a valid request.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "server_error", message)
    }

    /// The JSON body.
    pub fn body(&self) -> serde_json::Value {
        serde_json::json!({
            "error": {
                "message": self.message,
                "type": self.kind,
                "param": self.param,
                "code": self.code,
            }
        })
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}

impl From<lattice_inference::Error> for ApiError {
    fn from(e: lattice_inference::Error) -> Self {
        match e {
            lattice_inference::Error::InvalidInput(m) => ApiError::invalid(m),
            // The template rejected the conversation (e.g. `raise_exception` on a role order).
            lattice_inference::Error::ChatTemplate(m) => {
                ApiError::invalid_param("messages", format!("the chat template failed: {m}"))
            }
            other => ApiError::internal(other.to_string()),
        }
    }
}

impl From<lattice_embed::Error> for ApiError {
    fn from(e: lattice_embed::Error) -> Self {
        match e {
            lattice_embed::Error::InvalidInput(m) => ApiError::invalid(m),
            lattice_embed::Error::Inference(e) => e.into(),
            other => ApiError::internal(other.to_string()),
        }
    }
}
