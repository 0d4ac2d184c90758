// The console's shell: sign-in, the header (namespace, user, theme), the nav, keyboard shortcuts and
// the hash router that loads one page module at a time (pages/<name>.js, `render(root, params, ctx)`).

import * as api from "./lib/api.js";
import * as oidc from "./lib/oidc.js";
import { h, clear, errorBox, empty, select, toast } from "./lib/ui.js";
import * as runsPage from "./pages/runs.js";  // the landing page, loaded with the shell: no import() wait

// The nav, each entry with its `g <key>` shortcut and the routes (hash pattern -> page module) it covers.
const NAV = [
  { id: "runs", label: "Runs", key: "r", routes: { "/runs": "runs", "/runs/:namespace/:name": "run" } },
  { id: "approvals", label: "Approvals", key: "a", routes: { "/approvals": "approvals" } },
  { id: "agents", label: "Agents", key: "n", routes: { "/agents": "agents", "/agents/:namespace/:name": "agents" } },
  { id: "budgets", label: "Budgets", key: "b", routes: { "/budgets": "budgets" } },
  { id: "sources", label: "Sources & triggers", key: "s", routes: { "/sources": "sources" } },
  { id: "audit", label: "Audit", key: "u", routes: { "/audit": "audit" } },
  { id: "apply", label: "Apply", key: "y", routes: { "/apply": "apply" } },
];
const ROUTES = NAV.flatMap((n) => Object.entries(n.routes).map(([pattern, page]) => ({ pattern, page, nav: n.id })));

const THEME_KEY = "joch.theme";
const NAMESPACE_KEY = "joch.namespace";
const ALL = "";
const ENDED = "Your session has ended: sign in again.";

const state = {
  config: { version: "", oidc: null },
  user: null,
  namespaces: [],
  namespace: localStorage.getItem(NAMESPACE_KEY) ?? ALL,
  cleanup: null,
  canCache: new Map(),
  rendering: 0,
};

// --- theme ------------------------------------------------------------------------------------------

function applyTheme(theme) {
  if (theme === "dark" || theme === "light") document.documentElement.dataset.theme = theme;
  else delete document.documentElement.dataset.theme;
}

function currentTheme() {
  const chosen = document.documentElement.dataset.theme;
  if (chosen) return chosen;
  return matchMedia("(prefers-color-scheme: dark)").matches ? "dark" : "light";
}

function toggleTheme() {
  const next = currentTheme() === "dark" ? "light" : "dark";
  localStorage.setItem(THEME_KEY, next);
  applyTheme(next);
  const button = document.getElementById("theme-toggle");
  if (button) button.textContent = next === "dark" ? "Light theme" : "Dark theme";
}

applyTheme(localStorage.getItem(THEME_KEY));

// --- routing ----------------------------------------------------------------------------------------

// A path segment as text; a malformed %-escape (a hand-edited or hostile link) matches no route.
function decoded(segment) {
  try {
    return decodeURIComponent(segment);
  } catch {
    return "";
  }
}

function match(path) {
  for (const route of ROUTES) {
    const want = route.pattern.split("/");
    const got = path.split("/");
    if (want.length !== got.length) continue;
    const params = {};
    if (want.every((part, i) => (part.startsWith(":") ? (params[part.slice(1)] = decoded(got[i])) !== ""
                                                    : part === got[i]))) {
      return { route, params };
    }
  }
  return null;
}

function currentPath() {
  const hash = location.hash.replace(/^#/, "");
  const [path, query] = hash.split("?");
  return { path: path || "/runs", query: new URLSearchParams(query || "") };
}

function navigate(hash) {
  const target = hash.startsWith("#") ? hash : `#${hash}`;
  if (location.hash === target) route();
  else location.hash = target;
}

async function route() {
  if (!state.user) return;
  const { path, query } = currentPath();
  const found = match(path);
  const ticket = ++state.rendering;
  if (state.cleanup) {
    try {
      state.cleanup();
    } catch (err) {
      console.error(err);
    }
    state.cleanup = null;
  }
  const main = document.getElementById("main");
  clear(main);
  for (const a of document.querySelectorAll(".nav a")) {
    a.toggleAttribute("aria-current", Boolean(found && a.dataset.nav === found.route.nav));
  }
  document.getElementById("nav")?.classList.remove("open");
  if (!found) {
    main.append(empty(`No page at ${path}.`));
    return;
  }
  const root = h("div", { class: "page", dataset: { page: found.route.page } });
  main.append(root);
  let module;
  try {
    module = found.route.page === "runs" ? runsPage : await import(`./pages/${found.route.page}.js`);
  } catch (err) {
    console.warn(err);
    root.append(empty(`The ${found.route.page} page is not built yet.`));
    return;
  }
  if (ticket !== state.rendering) return;
  try {
    const cleanup = await module.render(root, { ...found.params, query }, context());
    if (ticket !== state.rendering) {
      if (typeof cleanup === "function") cleanup();
      return;
    }
    state.cleanup = typeof cleanup === "function" ? cleanup : null;
  } catch (err) {
    console.error(err);
    if (err.status === 401) return signOut(ENDED);
    root.append(errorBox(err));
  }
}

function context() {
  return {
    api,
    user: state.user,
    namespace: state.namespace,
    navigate,
    can: (verb, resource, namespace, group) => can(verb, resource, namespace ?? state.namespace, group),
  };
}

function can(verb, resource, namespace, group = "") {
  const key = [verb, resource, namespace || "", group].join("|");
  if (!state.canCache.has(key)) {
    state.canCache.set(key, api.accessReview(verb, resource, namespace, group).catch(() => false));
  }
  return state.canCache.get(key);
}

// --- sign-in ----------------------------------------------------------------------------------------

async function signIn(tokenValue) {
  const user = await api.whoami(tokenValue);
  api.setToken(tokenValue);
  return user;
}

function signOut(message, options) {
  api.setToken("");
  state.user = null;
  state.canCache.clear();
  if (state.cleanup) state.cleanup();
  state.cleanup = null;
  renderSignIn(message, options);
}

// `message`: why the sign-in page is shown (an error, or `notice` for a plain note such as "Signed out.").
function renderSignIn(message, { notice = false } = {}) {
  const app = clear(document.getElementById("app"));
  const input = h("input", { id: "token", class: "input", type: "password", autocomplete: "off",
                             spellcheck: "false", placeholder: "Bearer token", "aria-label": "Token", required: true });
  const error = h("p", { class: notice ? "sign-in-error muted" : "sign-in-error", role: "alert", id: "sign-in-error" },
                  message || "");
  const submit = h("button", { class: "button primary", type: "submit" }, "Sign in");
  const form = h("form", { class: "sign-in-form", onsubmit: async (e) => {
    e.preventDefault();
    error.textContent = "";
    submit.disabled = true;
    try {
      state.user = await signIn(input.value.trim());
      await start();
    } catch (err) {
      error.textContent = err.status === 401
        ? `${err.message}: the server does not accept this token.`
        : `${err.reason ? `${err.reason}: ` : ""}${err.message}`;
      input.select();
    } finally {
      submit.disabled = false;
    }
  } }, h("label", { class: "field" }, h("span", { class: "field-label" }, "Token"), input), submit);
  const oidcButton = state.config.oidc
    ? h("button", { class: "button", type: "button", id: "oidc-sign-in", onclick: () => oidc.begin(state.config.oidc)
        .catch((err) => { error.textContent = err.message; }) }, "Sign in with single sign-on")
    : null;
  app.append(h("main", { class: "sign-in" },
    h("div", { class: "sign-in-card card" },
      h("div", { class: "brand big" }, h("span", { class: "logo", "aria-hidden": "true" }, "J"), "Joch"),
      h("p", { class: "muted" }, "Sign in with a bearer token, the one the CLI sends (--token, JOCH_TOKEN or "
                                 + "your context's)", state.config.oidc ? ", or with your organisation's single sign-on." : "."),
      form,
      oidcButton ? h("div", { class: "or" }, "or") : null,
      oidcButton,
      error)));
  input.focus();
}

// --- layout -----------------------------------------------------------------------------------------

function renderLayout() {
  const app = clear(document.getElementById("app"));
  const navToggle = h("button", { class: "button icon nav-toggle", "aria-label": "Menu", "aria-controls": "nav",
                                  onclick: () => document.getElementById("nav").classList.toggle("open") }, "☰");
  const nsOptions = [...(state.namespaces.length !== 1 || state.namespace === ALL ? [[ALL, "All namespaces"]] : []),
                     ...state.namespaces.map((n) => [n, n])];
  const nsSelect = select("Namespace", nsOptions, state.namespace, (value) => {
    state.namespace = value;
    localStorage.setItem(NAMESPACE_KEY, value);
    route();
  }, { id: "namespace" });
  const theme = h("button", { class: "button ghost", id: "theme-toggle", onclick: toggleTheme },
                  currentTheme() === "dark" ? "Light theme" : "Dark theme");
  // Without a token (a server without authentication) there is nothing to sign out of.
  const signOutButton = api.token() ? h("button", { class: "button ghost", id: "sign-out",
                                                    onclick: () => signOut("Signed out.", { notice: true }) }, "Sign out") : null;
  const header = h("header", { class: "topbar" },
    navToggle,
    h("a", { class: "brand", href: "#/runs", "aria-label": "Joch" }, h("span", { class: "logo", "aria-hidden": "true" }, "J"),
      h("span", { class: "brand-name" }, "Joch")),
    h("div", { class: "topbar-ns" }, nsSelect),
    h("div", { class: "topbar-right" },
      h("span", { class: "user", id: "user", title: state.user.groups.join(", ") }, state.user.name),
      theme, signOutButton));
  const nav = h("nav", { class: "nav", id: "nav", "aria-label": "Pages" },
    NAV.map((n) => h("a", { href: `#/${n.id}`, dataset: { nav: n.id }, title: `g ${n.key}`,
                            onclick: () => document.getElementById("nav").classList.remove("open") }, n.label)),
    h("div", { class: "nav-foot muted" },
      h("button", { class: "button ghost phone-only", onclick: toggleTheme }, "Toggle theme"),
      `Joch ${state.config.version}`, h("br"), "Press ? for shortcuts"));
  app.append(header, h("div", { class: "body" }, nav, h("main", { id: "main", class: "main", tabindex: "-1" })));
}

// The namespaces the user can pick, and whether they may list runs across all of them.
async function namespaces() {
  const listAll = can("list", "agentruns", "", "runtime.joch.dev");
  let names;
  try {
    const list = await api.get("/api/v1/namespaces");
    names = (list.items || []).map((n) => n.metadata.name).sort();
  } catch {
    names = ["default"];  // a user bound in one namespace may not list them
  }
  return { names, listAll: await listAll };
}

// `early`: namespaces() asked while the user was still being looked up (one round trip less).
async function start(early) {
  const { names, listAll } = await (early || (state.canCache.clear(), namespaces()));
  state.namespaces = names;
  if (state.namespace !== ALL && !names.includes(state.namespace)) state.namespace = ALL;
  if (state.namespace === ALL && !listAll) state.namespace = names.includes("default") ? "default" : names[0] || "default";
  renderLayout();
  if (!location.hash || location.hash === "#" || location.hash.startsWith("#/signin")) {
    history.replaceState(null, "", "#/runs");
  }
  await route();
}

// --- keyboard ---------------------------------------------------------------------------------------

let pendingG = 0;

function typing(target) {
  return target && (target.isContentEditable || ["INPUT", "TEXTAREA", "SELECT"].includes(target.tagName));
}

function showShortcuts() {
  if (document.getElementById("shortcuts")) return;
  const dialog = h("dialog", { class: "dialog", id: "shortcuts" },
    h("h2", {}, "Keyboard shortcuts"),
    h("dl", { class: "facts" },
      NAV.map((n) => [h("dt", {}, h("kbd", {}, "g"), " ", h("kbd", {}, n.key)), h("dd", {}, n.label)]),
      h("dt", {}, h("kbd", {}, "/")), h("dd", {}, "Focus the filter"),
      h("dt", {}, h("kbd", {}, "↑"), " ", h("kbd", {}, "↓"), " ", h("kbd", {}, "Enter")), h("dd", {}, "Move in a table, open a row"),
      h("dt", {}, h("kbd", {}, "t")), h("dd", {}, "Toggle dark / light theme")),
    h("form", { method: "dialog" }, h("button", { class: "button primary" }, "Close")));
  dialog.addEventListener("close", () => dialog.remove());
  document.body.append(dialog);
  dialog.showModal();
}

document.addEventListener("keydown", (e) => {
  if (!state.user || e.ctrlKey || e.metaKey || e.altKey || typing(e.target) || document.querySelector("dialog[open]")) {
    return;
  }
  if (pendingG && Date.now() - pendingG < 1500) {
    pendingG = 0;
    const entry = NAV.find((n) => n.key === e.key);
    if (entry) {
      e.preventDefault();
      navigate(`#/${entry.id}`);
    }
    return;
  }
  if (e.key === "g") pendingG = Date.now();
  else if (e.key === "/") {
    const filter = document.querySelector("#main [data-filter]");
    if (filter) {
      e.preventDefault();
      filter.focus();
    }
  } else if (e.key === "?") showShortcuts();
  else if (e.key === "t") toggleTheme();
});

// --- boot -------------------------------------------------------------------------------------------

async function boot() {
  // A first visit is a few round trips, not a chain: the config, the user (with the tab's token, or
  // none: a server without authentication answers anyway) and the namespaces are asked for at once.
  const returning = new URLSearchParams(location.search);
  const signingIn = returning.has("code") || returning.has("error");
  const early = signingIn ? null : namespaces();  // dropped if the user turns out not to be signed in
  const [config, user] = await Promise.allSettled([
    api.get("/console/config.json"), signingIn ? Promise.reject(new Error("signing in")) : api.whoami()]);
  if (config.status === "fulfilled") state.config = config.value;  // else: token sign-in still works
  try {
    const idToken = await oidc.complete(state.config.oidc);  // back from the issuer with ?code=
    if (idToken) {
      state.user = await signIn(idToken);
      return start();
    }
  } catch (err) {
    return renderSignIn(err.message);
  }
  if (user.status === "fulfilled") {
    state.user = user.value;
    return start(early);
  }
  const err = user.reason;
  if (err.status === 401) return renderSignIn(api.token() ? ENDED : "");
  clear(document.getElementById("app")).append(h("main", { class: "sign-in" }, errorBox(err)));
  toast(err.message, "error");
  return undefined;
}

window.addEventListener("hashchange", route);
window.addEventListener(api.SESSION_ENDED, () => {
  if (state.user) signOut(ENDED);
});
boot();
