package relay.peers;

import java.io.ByteArrayOutputStream;
import java.nio.ByteBuffer;
import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;

/**
 * The few msgpack types the benchmark apps exchange with the Python side: maps with string
 * keys, strings, integers, floats, booleans, nil, binaries and arrays. Strings are written as
 * msgpack str (what Python's msgpack writes for str), so both sides decode the same values.
 */
final class MsgPack {
    private MsgPack() {
    }

    /** Decodes one msgpack map (an IllegalArgumentException says what else was found). */
    @SuppressWarnings("unchecked")
    static Map<String, Object> readMap(byte[] bytes) {
        Object value = new Reader(ByteBuffer.wrap(bytes)).read();
        if (!(value instanceof Map)) {
            throw new IllegalArgumentException("msgpack: expected a map, found " + value);
        }
        return (Map<String, Object>) value;
    }

    /** A map written entry by entry, in order. */
    static final class MapWriter {
        private final List<Object[]> entries = new ArrayList<>();

        MapWriter put(String key, Object value) {
            entries.add(new Object[] {key, value});
            return this;
        }

        byte[] bytes() {
            ByteArrayOutputStream out = new ByteArrayOutputStream(64);
            writeMapHeader(out, entries.size());
            for (Object[] entry : entries) {
                write(out, entry[0]);
                write(out, entry[1]);
            }
            return out.toByteArray();
        }
    }

    static MapWriter map() {
        return new MapWriter();
    }

    private static void writeMapHeader(ByteArrayOutputStream out, int size) {
        if (size < 16) {
            out.write(0x80 | size);
        } else {
            out.write(0xde);
            out.write(size >>> 8);
            out.write(size);
        }
    }

    private static void write(ByteArrayOutputStream out, Object value) {
        if (value == null) {
            out.write(0xc0);
        } else if (value instanceof Boolean b) {
            out.write(b ? 0xc3 : 0xc2);
        } else if (value instanceof Double d) {
            out.write(0xcb);
            out.writeBytes(ByteBuffer.allocate(8).putDouble(d).array());
        } else if (value instanceof Number n) {
            writeLong(out, n.longValue());
        } else if (value instanceof String s) {
            writeString(out, s.getBytes(StandardCharsets.UTF_8));
        } else if (value instanceof byte[] b) {
            out.write(0xc6);
            out.writeBytes(ByteBuffer.allocate(4).putInt(b.length).array());
            out.writeBytes(b);
        } else if (value instanceof List<?> list) {
            out.write(0xdd);
            out.writeBytes(ByteBuffer.allocate(4).putInt(list.size()).array());
            for (Object item : list) {
                write(out, item);
            }
        } else {
            throw new IllegalArgumentException("msgpack: cannot write " + value.getClass());
        }
    }

    private static void writeString(ByteArrayOutputStream out, byte[] utf8) {
        int n = utf8.length;
        if (n < 32) {
            out.write(0xa0 | n);
        } else if (n < 0x100) {
            out.write(0xd9);
            out.write(n);
        } else if (n < 0x10000) {
            out.write(0xda);
            out.write(n >>> 8);
            out.write(n);
        } else {
            out.write(0xdb);
            out.writeBytes(ByteBuffer.allocate(4).putInt(n).array());
        }
        out.writeBytes(utf8);
    }

    private static void writeLong(ByteArrayOutputStream out, long n) {
        if (n >= 0 && n < 0x80) {
            out.write((int) n);
        } else if (n < 0 && n >= -32) {
            out.write((int) (n & 0xff));
        } else {
            out.write(0xd3);
            out.writeBytes(ByteBuffer.allocate(8).putLong(n).array());
        }
    }

    private static final class Reader {
        private final ByteBuffer in;

        Reader(ByteBuffer in) {
            this.in = in;
        }

        Object read() {
            int b = in.get() & 0xff;
            if (b < 0x80) {
                return (long) b;
            }
            if (b >= 0xe0) {
                return (long) (byte) b;
            }
            if ((b & 0xf0) == 0x80) {
                return map(b & 0x0f);
            }
            if ((b & 0xf0) == 0x90) {
                return array(b & 0x0f);
            }
            if ((b & 0xe0) == 0xa0) {
                return string(b & 0x1f);
            }
            return switch (b) {
                case 0xc0 -> null;
                case 0xc2 -> false;
                case 0xc3 -> true;
                case 0xc4 -> bytes(in.get() & 0xff);
                case 0xc5 -> bytes(in.getShort() & 0xffff);
                case 0xc6 -> bytes(in.getInt());
                case 0xca -> (double) in.getFloat();
                case 0xcb -> in.getDouble();
                case 0xcc -> (long) (in.get() & 0xff);
                case 0xcd -> (long) (in.getShort() & 0xffff);
                case 0xce -> in.getInt() & 0xffffffffL;
                case 0xcf, 0xd3 -> in.getLong();
                case 0xd0 -> (long) in.get();
                case 0xd1 -> (long) in.getShort();
                case 0xd2 -> (long) in.getInt();
                case 0xd9 -> string(in.get() & 0xff);
                case 0xda -> string(in.getShort() & 0xffff);
                case 0xdb -> string(in.getInt());
                case 0xdc -> array(in.getShort() & 0xffff);
                case 0xdd -> array(in.getInt());
                case 0xde -> map(in.getShort() & 0xffff);
                case 0xdf -> map(in.getInt());
                default -> throw new IllegalArgumentException(
                        String.format("msgpack: unsupported type byte 0x%02x", b));
            };
        }

        private byte[] bytes(int n) {
            byte[] out = new byte[n];
            in.get(out);
            return out;
        }

        private String string(int n) {
            return new String(bytes(n), StandardCharsets.UTF_8);
        }

        private List<Object> array(int n) {
            List<Object> out = new ArrayList<>(n);
            for (int i = 0; i < n; i++) {
                out.add(read());
            }
            return out;
        }

        private Map<String, Object> map(int n) {
            Map<String, Object> out = new LinkedHashMap<>();
            for (int i = 0; i < n; i++) {
                out.put(String.valueOf(read()), read());
            }
            return out;
        }
    }
}
