// A form that writes through the control plane: a 400's envelope lands on the field it names
// (`param`, camelCase like the form's field names), anything else above the form — never swallowed.
import { useState } from "react";
import { Form, type FormInstance } from "antd";
import { ApiError } from "./api";

export interface ApiForm<T> {
  form: FormInstance<T>;
  /** The error no field of the form can show (a 403, a 409, a param of no field here). */
  problem: string | undefined;
  busy: boolean;
  /** Run `call`; on success `done`, on failure the error where it belongs. True if it worked. */
  submit: (call: () => Promise<unknown>, done?: () => void) => Promise<boolean>;
  clear: () => void;
}

/** Where an error shows: the named field if the form has it, else the form's own alert. */
export function placeError(error: unknown, fields: readonly string[]): { field?: string; message: string } {
  const message = error instanceof Error ? error.message : String(error);
  if (error instanceof ApiError && error.param && fields.includes(error.param)) {
    return { field: error.param, message };
  }
  return { message };
}

export function useApiForm<T>(fields: readonly string[]): ApiForm<T> {
  const [form] = Form.useForm<T>();
  const [problem, setProblem] = useState<string>();
  const [busy, setBusy] = useState(false);

  async function submit(call: () => Promise<unknown>, done?: () => void): Promise<boolean> {
    setBusy(true);
    setProblem(undefined);
    try {
      await call();
      done?.();
      return true;
    } catch (error) {
      const placed = placeError(error, fields);
      if (placed.field) form.setFields([{ name: placed.field as never, errors: [placed.message] }]);
      else setProblem(placed.message);
      return false;
    } finally {
      setBusy(false);
    }
  }

  return { form, problem, busy, submit, clear: () => setProblem(undefined) };
}
