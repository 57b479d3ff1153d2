// The login page: POST /api/session, then on to the page that sent the user here.
import { ApiError, signIn } from "./api.js";
import { h, show } from "./dom.js";
import { go, safeNext } from "./nav.js";

const NOTICES = {
  ended: "Your session has ended; sign in again.",
  "signed-out": "You have signed out.",
};

export function waitText(seconds) {
  if (seconds < 90) return `${seconds} second${seconds === 1 ? "" : "s"}`;
  const minutes = Math.ceil(seconds / 60);
  return `${minutes} minutes`;
}

export async function loginView({ main, params }) {
  const notice = NOTICES[params.get("notice")];
  const next = safeNext(params.get("next"));
  const error = h("p", { id: "login-error", class: "error", role: "alert", hidden: true });
  const userId = h("input", {
    id: "user-id", name: "user_id", autocomplete: "username", required: true,
    autocapitalize: "none", spellcheck: "false", "aria-describedby": "login-error",
  });
  const password = h("input", {
    id: "password", name: "password", type: "password", autocomplete: "current-password",
    required: true, "aria-describedby": "login-error",
  });
  const submit = h("button", { type: "submit", text: "Sign in" });

  async function onsubmit(event) {
    event.preventDefault();
    submit.disabled = true;
    error.hidden = true;
    try {
      await signIn(userId.value.trim(), password.value);
      go(next);
    } catch (failure) {
      let text = failure.message;
      if (failure instanceof ApiError && failure.status === 429 && failure.retryAfter) {
        text = `${text} Try again in ${waitText(failure.retryAfter)}.`;
      }
      const wrong = failure instanceof ApiError && failure.status === 401;
      userId.setAttribute("aria-invalid", String(wrong));
      password.setAttribute("aria-invalid", String(wrong));
      error.textContent = text;
      error.hidden = false;
      password.value = "";
      password.focus();
    } finally {
      submit.disabled = false;
    }
  }

  show(
    main,
    h(
      "section", { class: "login", "aria-labelledby": "login-title" },
      h("h1", { id: "login-title", tabindex: "-1", text: "Sign in to Workshop" }),
      notice ? h("p", { class: "notice", role: "status", text: notice }) : null,
      h(
        "form", { onsubmit, novalidate: false },
        h("label", { for: "user-id", text: "User id" }), userId,
        h("label", { for: "password", text: "Password" }), password,
        error,
        submit,
      ),
    ),
  );
  document.title = "Sign in · Workshop";
  userId.focus();
}
