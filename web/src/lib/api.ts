// Every call the console makes: same origin (the gateway passes /api/v1 to the control plane,
// ADR 0012), the signed-in credential as a bearer token, errors as the OpenAI-style envelope.

export class ApiError extends Error {
  constructor(
    message: string,
    readonly status: number,
    readonly code: string | null = null,
    readonly param: string | null = null,
  ) {
    super(message);
  }
}

export interface Call {
  method?: string;
  body?: unknown;
  token?: string | null;
  signal?: AbortSignal;
  accept?: string;
}

export function headers(token: string | null | undefined, extra: Record<string, string> = {}) {
  const out: Record<string, string> = { ...extra };
  if (token) out.Authorization = `Bearer ${token}`;
  return out;
}

export async function raw(path: string, call: Call = {}): Promise<Response> {
  const extra: Record<string, string> = { Accept: call.accept ?? "application/json" };
  const method = call.method ?? "GET";
  // the control plane takes every write as JSON, even one without a body (a pull, a close)
  if (call.body !== undefined || (method !== "GET" && method !== "HEAD")) {
    extra["Content-Type"] = "application/json";
  }
  const response = await fetch(path, {
    method,
    headers: headers(call.token, extra),
    body: call.body === undefined ? undefined : JSON.stringify(call.body),
    signal: call.signal,
  });
  if (!response.ok) throw await asError(response);
  return response;
}

export async function api<T>(path: string, call: Call = {}): Promise<T> {
  const response = await raw(path, call);
  return (await response.json()) as T;
}

export async function asError(response: Response): Promise<ApiError> {
  try {
    const body = await response.json();
    const error = body?.error ?? {};
    return new ApiError(
      String(error.message ?? response.statusText),
      response.status,
      error.code ?? null,
      error.param ?? null,
    );
  } catch {
    return new ApiError(`${response.status} ${response.statusText}`, response.status);
  }
}

export interface List<T> {
  object: "list";
  data: T[];
}
