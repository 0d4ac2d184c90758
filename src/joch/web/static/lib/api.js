// The server's API as the signed-in user: every call sends `Authorization: Bearer` from this tab's
// sessionStorage (never a cookie, never the URL), and every failure is an ApiError built from the
// Kubernetes Status the server answers with.

const TOKEN_KEY = "joch.token";
export const SESSION_ENDED = "joch:session-ended";  // a window event: the server refused the tab's token

export class ApiError extends Error {
  constructor(status, reason, message, details) {
    super(message || reason || `HTTP ${status}`);
    this.name = "ApiError";
    this.status = status;
    this.reason = reason || "";
    this.details = details || null;
  }
}

export function token() {
  return sessionStorage.getItem(TOKEN_KEY) || "";
}

export function setToken(value) {
  if (value) sessionStorage.setItem(TOKEN_KEY, value);
  else sessionStorage.removeItem(TOKEN_KEY);
}

function headers(extra, bearer) {
  const out = { Accept: "application/json", ...extra };
  const t = bearer === undefined ? token() : bearer;
  if (t) out.Authorization = `Bearer ${t}`;
  return out;
}

function url(path, query) {
  const u = new URL(path, location.origin);
  for (const [k, v] of Object.entries(query || {})) {
    if (v !== undefined && v !== null && v !== "") u.searchParams.set(k, String(v));
  }
  return u.pathname + u.search;
}

async function failure(response) {
  let body = null;
  try {
    body = await response.json();
  } catch {
    // not JSON: a proxy's page, say
  }
  if (body && body.kind === "Status") {
    return new ApiError(response.status, body.reason, body.message, body.details);
  }
  return new ApiError(response.status, response.statusText, `${response.status} ${response.statusText}`, null);
}

async function send(method, path, { query, body, contentType, bearer, raw, signal } = {}) {
  const init = { method, headers: headers(contentType ? { "Content-Type": contentType } : {}, bearer),
                 credentials: "omit", cache: "no-store", signal };
  if (body !== undefined) init.body = typeof body === "string" ? body : JSON.stringify(body);
  let response;
  try {
    response = await fetch(url(path, query), init);
  } catch (err) {
    throw new ApiError(0, "NetworkError", `the server did not answer (${err.message})`, null);
  }
  if (!response.ok) {
    // The tab's token stopped working (expired, revoked): tell the shell, whichever call noticed it
    // first, a click or a watch reconnecting. A token being tried (`bearer`) is the sign-in form's.
    if (response.status === 401 && bearer === undefined && token()) window.dispatchEvent(new Event(SESSION_ENDED));
    throw await failure(response);
  }
  if (raw) return response;
  if (response.status === 204) return null;
  const type = response.headers.get("Content-Type") || "";
  return type.includes("json") ? response.json() : response.text();
}

export function get(path, query) {
  return send("GET", path, { query });
}

export function post(path, body, { contentType = "application/json", query, bearer } = {}) {
  return send("POST", path, { body, contentType, query, bearer });
}

export function put(path, body, { contentType = "application/json" } = {}) {
  return send("PUT", path, { body, contentType });
}

const PATCH_TYPES = { merge: "application/merge-patch+json", json: "application/json-patch+json",
                      apply: "application/apply-patch+yaml" };

export function patch(path, body, type = "merge") {
  return send("PATCH", path, { body, contentType: PATCH_TYPES[type] || type });
}

export function del(path) {
  return send("DELETE", path, {});
}

export async function text(path, query) {
  const response = await send("GET", path, { query, raw: true });
  return response.text();
}

// The raw Response of a GET (a download, a followed log's body stream).
export function fetchRaw(path, query, signal) {
  return send("GET", path, { query, raw: true, signal });
}

export function resourcePath(group, version, plural, namespace, name) {
  const base = group ? `/apis/${group}/${version}` : `/api/${version}`;
  const ns = namespace ? `/namespaces/${encodeURIComponent(namespace)}` : "";
  return `${base}${ns}/${plural}${name ? `/${encodeURIComponent(name)}` : ""}`;
}

export function list(group, version, plural, { namespace, labelSelector, fieldSelector, limit, continueToken } = {}) {
  return get(resourcePath(group, version, plural, namespace),
             { labelSelector, fieldSelector, limit, continue: continueToken });
}

// Streams the NDJSON lines of a response body, one parsed object at a time.
async function* lines(response, signal) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  try {
    while (!signal.aborted) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += decoder.decode(value, { stream: true });
      let end;
      while ((end = buffer.indexOf("\n")) >= 0) {
        const line = buffer.slice(0, end).trim();
        buffer = buffer.slice(end + 1);
        if (line) yield JSON.parse(line);
      }
    }
  } finally {
    reader.cancel().catch(() => {});
  }
}

const RETRY_MS = [500, 1000, 2000, 5000, 10000];

// A watch (`?watch=1`) that stays open: when the stream ends it is opened again from the last
// resourceVersion seen (bookmarks included), so nothing is missed. When that version is too old
// (410 Expired) it starts over from the current state: onEvent gets {type: "RESYNC"} first, then
// every object as ADDED — or, given onExpired, the watch ends and onExpired() is called (a paged
// page lists its first page again rather than receive every object). onEvent({type, object}) sees
// ADDED, MODIFIED and DELETED; onError(err) hears of a failure before each retry.
export function watch(path, query, onEvent, { onError, onExpired } = {}) {
  const controller = new AbortController();
  let resourceVersion = (query && query.resourceVersion) || "";
  let failures = 0;

  async function once() {
    const q = { ...query, watch: 1, allowWatchBookmarks: "true", resourceVersion };
    const response = await send("GET", path, { query: q, raw: true, signal: controller.signal }).catch((err) => {
      if (err.status === 410) return "expired";
      throw err;
    });
    if (response === "expired") return "expired";
    failures = 0;
    for await (const event of lines(response, controller.signal)) {
      const rv = event.object && event.object.metadata && event.object.metadata.resourceVersion;
      if (event.type === "ERROR") {
        if (event.object && event.object.code === 410) return "expired";
        throw new ApiError(event.object.code || 500, event.object.reason, event.object.message, null);
      }
      if (rv) resourceVersion = rv;
      if (event.type !== "BOOKMARK") onEvent(event);
    }
    return "ended";
  }

  (async () => {
    while (!controller.signal.aborted) {
      try {
        if ((await once()) === "expired") {
          if (onExpired) {
            controller.abort();
            onExpired();
            return;
          }
          resourceVersion = "";
          onEvent({ type: "RESYNC", object: null });
        }
      } catch (err) {
        if (controller.signal.aborted) return;
        if (err.status === 401 || err.status === 403) {
          if (onError) onError(err);
          return;
        }
        if (onError) onError(err);
        await new Promise((r) => setTimeout(r, RETRY_MS[Math.min(failures++, RETRY_MS.length - 1)]));
      }
    }
  })();

  return { close: () => controller.abort() };
}

// The user the token belongs to ({name, groups}); a bad token is the server's 401.
export async function whoami(bearer) {
  const review = await post("/apis/authentication.k8s.io/v1/selfsubjectreviews",
                            { apiVersion: "authentication.k8s.io/v1", kind: "SelfSubjectReview" }, { bearer });
  const info = (review.status && review.status.userInfo) || {};
  return { name: info.username || "", groups: info.groups || [] };
}

// Whether the signed-in user may `verb` the `resource` ("approvals/decide": a subresource).
export async function accessReview(verb, resource, namespace, group) {
  const [plural, subresource] = resource.split("/");
  const review = await post("/apis/authorization.k8s.io/v1/selfsubjectaccessreviews", {
    apiVersion: "authorization.k8s.io/v1", kind: "SelfSubjectAccessReview",
    spec: { resourceAttributes: { verb, resource: plural, subresource: subresource || "",
                                  namespace: namespace || "", group: group || "" } },
  });
  return Boolean(review.status && review.status.allowed);
}
