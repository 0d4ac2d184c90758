// OpenID Connect sign-in from the browser: the authorization-code flow with PKCE (a public client,
// no secret), against the issuer the server verifies ID tokens from (/console/config.json). The ID
// token the issuer returns is the bearer token, exactly as `kubectl --token` would send it; the
// server checks its signature, issuer, audience and expiry. The verifier, state and nonce live in
// sessionStorage only for the round trip.

const PENDING_KEY = "joch.oidc";

function base64url(bytes) {
  let s = "";
  for (const b of new Uint8Array(bytes)) s += String.fromCharCode(b);
  return btoa(s).replace(/\+/g, "-").replace(/\//g, "_").replace(/=+$/, "");
}

function random() {
  return base64url(crypto.getRandomValues(new Uint8Array(32)));
}

function redirectUri() {
  return `${location.origin}/console/`;
}

async function discover(issuer) {
  const response = await fetch(`${issuer.replace(/\/$/, "")}/.well-known/openid-configuration`,
                               { credentials: "omit" });
  if (!response.ok) throw new Error(`the identity provider's discovery document answered ${response.status}`);
  return response.json();
}

export async function begin(config) {
  const discovery = await discover(config.issuer);
  const verifier = random();
  const challenge = base64url(await crypto.subtle.digest("SHA-256", new TextEncoder().encode(verifier)));
  const pending = { verifier, state: random(), nonce: random(), hash: location.hash };
  sessionStorage.setItem(PENDING_KEY, JSON.stringify(pending));
  const u = new URL(discovery.authorization_endpoint);
  const query = { response_type: "code", client_id: config.clientId, redirect_uri: redirectUri(),
                  scope: "openid email profile", state: pending.state, nonce: pending.nonce,
                  code_challenge: challenge, code_challenge_method: "S256" };
  for (const [k, v] of Object.entries(query)) u.searchParams.set(k, v);
  location.assign(u.toString());
}

function claims(idToken) {
  const part = idToken.split(".")[1] || "";
  const json = atob(part.replace(/-/g, "+").replace(/_/g, "/"));
  return JSON.parse(json);
}

// The ID token when this page load is the issuer's redirect back (?code=&state=), else null.
export async function complete(config) {
  const params = new URLSearchParams(location.search);
  if (!params.has("code") && !params.has("error")) return null;
  const pending = JSON.parse(sessionStorage.getItem(PENDING_KEY) || "null");
  sessionStorage.removeItem(PENDING_KEY);
  history.replaceState(null, "", `${location.pathname}${pending && pending.hash ? pending.hash : ""}`);
  if (params.has("error")) {
    throw new Error(`single sign-on failed: ${params.get("error_description") || params.get("error")}`);
  }
  if (!config || !pending || params.get("state") !== pending.state) {
    throw new Error("single sign-on failed: the answer does not belong to a sign-in started here; try again");
  }
  const discovery = await discover(config.issuer);
  const body = new URLSearchParams({ grant_type: "authorization_code", code: params.get("code"),
                                     redirect_uri: redirectUri(), client_id: config.clientId,
                                     code_verifier: pending.verifier });
  const response = await fetch(discovery.token_endpoint, { method: "POST", body, credentials: "omit" });
  const answer = await response.json().catch(() => ({}));
  if (!response.ok || !answer.id_token) {
    throw new Error(`single sign-on failed: ${answer.error_description || answer.error || response.status}`);
  }
  if (claims(answer.id_token).nonce !== pending.nonce) {
    throw new Error("single sign-on failed: the ID token was not issued for this sign-in");
  }
  return answer.id_token;
}
