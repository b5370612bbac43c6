// The signed-in credential: kept in sessionStorage (this tab only, gone when it closes), so a
// reload of a deep link stays signed in without writing a secret anywhere lasting.
import { createContext, useContext } from "react";
import type { Who } from "./lib/access";

export interface Session {
  token: string | null;
  who: Who;
  signOut: () => void;
}

export const SessionContext = createContext<Session | null>(null);

export function useSession(): Session {
  const session = useContext(SessionContext);
  if (!session) throw new Error("useSession outside the signed-in console");
  return session;
}

const KEY = "fleet.console.token";

export function storedToken(): string | null {
  return sessionStorage.getItem(KEY);
}

export function storeToken(token: string | null): void {
  if (token) sessionStorage.setItem(KEY, token);
  else sessionStorage.removeItem(KEY);
}

export function navigate(path: string): void {
  window.history.pushState(null, "", path);
  window.dispatchEvent(new PopStateEvent("popstate"));
}
